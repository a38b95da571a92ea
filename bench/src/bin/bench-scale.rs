//! One operator, a whole cluster: thousands of GraceRoutes and injected pods
//! on simulated nodes, against the local cluster's real API server.
//!
//! kwok (`sigs.k8s.io/kwok`, built from the Go module proxy by `bench/scale`)
//! plays the kubelets of `--nodes` fake nodes: it schedules nothing itself,
//! it only moves the pods the real scheduler put on them to Running and
//! Ready (and finishes their deletion). Everything else is real: the API
//! server, the controller-manager that turns Deployments into pods, the
//! scheduler, and the release operator binary on this host, whose webhook
//! the API server calls for every pod.
//!
//! The run, each phase bounded in time:
//! 1. **Storm**: `--routes` Deployments in `--namespaces` namespaces, each
//!    with `--pods-per-route` replicas and its GraceRoute, applied as fast as
//!    the API server takes them. Timed: until every pod is injected and Ready
//!    and every route `Ready` at its generation. Meanwhile the same pod is
//!    sent through admission (dryRun=All), interleaved: without a webhook,
//!    through the operator's, and through one that admits it unchanged
//!    (`bench-null-webhook`): the webhook's added latency while the storm
//!    lasts, and how much of it any webhook costs on this machine.
//! 2. **Steady**: the operator's RSS and CPU with nothing changing.
//! 3. **Cold start**: the operator stopped, every route edited (a config
//!    change that rolls nothing) while it is down, the operator started
//!    again. Timed: until every route's status is at its new generation;
//!    RSS after.
//! 4. **Rolling restart**: every Deployment restarted at once
//!    (`kubectl rollout restart`); timed until every Deployment is rolled
//!    out and every route current again.
//!
//! The operator's RSS and CPU are sampled from /proc all along. Everything
//! is deleted at the end (namespaces while the operator still removes its
//! finalizers, then kwok, then the nodes), on failure too.
//!
//!   e2e/cluster/with-cluster cargo run -p kubegrace-bench --features operator --bin bench-scale
//! (`make bench-scale`; see `bench/scale`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures_util::StreamExt as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use kubegrace_bench::operator_rig::{
    GraceRoute, Histogram, INJECT_WEBHOOK, Operator, apiserver_webhook_calls, client,
    create_mutating_webhook, create_validating_webhook, install_crd, metrics, operator_bin,
    rand_suffix, route_resource, wait_ca_bundle, wait_for, write_report,
};
use kubegrace_bench::scale_probe::{
    NULL_WEBHOOK, NullWebhook, added, admission_probe, probe_route,
};
use kubegrace_bench::scale_watch::{Tracker, per_reconcile, pods_injected};
use kubegrace_bench::{procfs, scale_checks};
use kubegrace_sidecar_api::keys;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "kubegrace-operator at scale: kwok nodes, thousands of routes and pods")]
struct Args {
    /// Fake (kwok) nodes.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    nodes: u32,
    /// Namespaces the routes are spread over.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=2000))]
    namespaces: u32,
    /// GraceRoutes, one Deployment each.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=5000))]
    routes: u32,
    /// Replicas of each Deployment.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    pods_per_route: u32,
    /// Run phase 4, the rolling restart of every Deployment (most of the run's
    /// time: the controller-manager replaces pods at its API rate).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    rolling_restart: bool,
    /// Upper bound of each phase's wait, seconds.
    #[arg(long, default_value_t = 600)]
    phase_timeout: u64,
    /// Upper bound of the whole run, seconds.
    #[arg(long, default_value_t = 2400)]
    deadline: u64,
    /// Where the JSON goes.
    #[arg(long, default_value = "bench/results/scale.json")]
    out: String,
    /// The kwok binary (`bench/scale` builds it).
    #[arg(long, env = "KUBEGRACE_KWOK_BIN", default_value = "kwok")]
    kwok_bin: String,
    /// kwok's lifecycle stages: a directory of Stage files (`bench/scale` puts
    /// the ones kwok publishes there).
    #[arg(long, env = "KUBEGRACE_KWOK_STAGES")]
    kwok_stages: String,
    /// The operator binary; default: the static release build of
    /// e2e/cluster/with-cluster in $CARGO_TARGET_DIR.
    #[arg(long, env = "KUBEGRACE_OPERATOR_BIN")]
    operator_bin: Option<String>,
    /// The baseline webhook that admits every pod unchanged (`bench/scale`
    /// builds it in release).
    #[arg(long, env = "KUBEGRACE_NULL_WEBHOOK_BIN")]
    null_webhook_bin: String,
    /// The CRD to install (what `kubegrace-operator crd` prints).
    #[arg(long, default_value = "crds/graceroutes.kubegrace.io.yaml")]
    crd: String,
}

/// The label every object of this run carries (value: the run's name);
/// kwok manages the nodes that have it, the webhooks serve the namespaces
/// that have it.
const RUN_LABEL: &str = "kubegrace.io/bench-scale";
/// Routes (with their Deployments) being created at once in the storm.
const CREATE_CONCURRENCY: usize = 8;

/// A watch task of the run, aborted with the run.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// kwok's own taint: only pods that tolerate it land on fake nodes.
const KWOK_TAINT: &str = "kwok.x-k8s.io/node";

/// Operator memory and CPU, sampled from /proc every 500 ms.
#[derive(Default)]
struct Samples {
    /// (seconds since start, RSS KiB, CPU ticks so far)
    points: Vec<(f64, u64, u64)>,
}

impl Samples {
    /// Peak and last RSS (MiB), and CPU seconds, between two instants.
    fn window(&self, from: f64, to: f64) -> Value {
        let inside: Vec<_> = self
            .points
            .iter()
            .filter(|(t, _, _)| *t >= from && *t <= to)
            .collect();
        let (Some(first), Some(last)) = (inside.first(), inside.last()) else {
            return json!(null);
        };
        let peak = inside.iter().map(|p| p.1).max().unwrap_or(0);
        let mib = |kib: u64| (kib as f64 / 1024.0 * 10.0).round() / 10.0;
        let cpu = last.2.saturating_sub(first.2) as f64 / procfs::clock_ticks_per_second();
        let secs = (last.0 - first.0).max(0.001);
        json!({
            "rss_peak_mib": mib(peak),
            "rss_last_mib": mib(last.1),
            "cpu_seconds": (cpu * 100.0).round() / 100.0,
            "cpu_cores_mean": (cpu / secs * 1000.0).round() / 1000.0,
        })
    }
}

/// Samples the process `pid` every 500 ms until it is gone or the task is aborted.
fn sample(pid: u32, t0: Instant, samples: Arc<Mutex<Samples>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stat = procfs::read_stat(pid);
            let Ok(stat) = stat else { return };
            let rss = procfs::tree_rss_kib(pid);
            let ticks = stat.cpu_ticks;
            if let Ok(mut s) = samples.lock() {
                s.points.push((t0.elapsed().as_secs_f64(), rss, ticks));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

fn node(name: &str, run: &str) -> anyhow::Result<Node> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: run, "type": "kwok"},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [{"key": KWOK_TAINT, "value": "fake", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
                   "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"}},
    }))?)
}

fn deployment(name: &str, replicas: u32, run: &str) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
                 "template": {
                    "metadata": {"labels": {"app": name, (keys::INJECT): "enabled", RUN_LABEL: run}},
                    "spec": {
                        "nodeSelector": {"type": "kwok", RUN_LABEL: run},
                        "tolerations": [{"key": KWOK_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [{"name": "app", "image": "localhost/kubegrace/pause:e2e",
                                        "imagePullPolicy": "Never",
                                        "ports": [{"name": "http", "containerPort": 8080}]}]}}}
    }))?)
}

fn route(name: &str, quiet_ms: u64) -> anyhow::Result<GraceRoute> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name},
        "spec": {"targetRef": {"kind": "Deployment", "name": name}, "ports": [{"name": "http"}],
                 "drain": {"quiet": format!("{quiet_ms}ms")}}
    }))?)
}

/// Waits until the watches say every route is Ready at its generation and
/// every Deployment rolled out, then checks (one paginated LIST) that every
/// pod is injected and Ready; the time it took. Polled every second, the
/// pod LIST at most every 10 s.
async fn until_current(
    client: &Client,
    tracker: &Tracker,
    run: &str,
    args: &Args,
    what: &str,
) -> anyhow::Result<Duration> {
    let routes = usize::try_from(args.routes)?;
    let pods = usize::try_from(args.routes * args.pods_per_route)?;
    let timeout = args.phase_timeout;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(timeout);
    let mut last = String::new();
    let mut listed: Option<Instant> = None;
    let selector = format!("{RUN_LABEL}={run}");
    loop {
        let state = match tracker.all_current(routes, routes) {
            Ok(()) if listed.is_none_or(|l| l.elapsed() >= Duration::from_secs(10)) => {
                listed = Some(Instant::now());
                pods_injected(client, &selector, keys::INJECTED, pods).await
            }
            Ok(()) => Err(last.clone()),
            Err(why) => Err(why),
        };
        match state {
            Ok(()) => {
                eprintln!("  {what}: done after {:.1}s", t.elapsed().as_secs_f64());
                return Ok(t.elapsed());
            }
            Err(why) => {
                if why != last {
                    eprintln!("  {what} [{:5.1}s]: {why}", t.elapsed().as_secs_f64());
                    last = why;
                }
            }
        }
        if Instant::now() > deadline {
            bail!("{what}: not done after {timeout}s: {last}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The null webhook's configuration of run `name`.
fn null_webhook_name(name: &str) -> String {
    format!("{name}-null")
}

/// `-c FILE` for each Stage file in `dir`.
fn stage_files(dir: &str) -> anyhow::Result<Vec<String>> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("kwok stages {dir} (bench/scale puts them there)"))?
        .filter_map(Result::ok)
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    if files.is_empty() {
        bail!("no kwok stage (*.yaml) in {dir}");
    }
    files.sort();
    Ok(files
        .into_iter()
        .flat_map(|f| ["-c".to_string(), f])
        .collect())
}

struct Run {
    client: Client,
    name: String,
    namespaces: Vec<String>,
    nodes: Vec<String>,
}

impl Run {
    /// Deletes the run's namespaces (the operator, still running, removes its
    /// finalizers; kwok finishes the pods), waits for them, then the rest.
    async fn delete_namespaces(&self) {
        for ns in &self.namespaces {
            kubegrace_e2e::delete_test_namespace(&self.client, ns).await;
        }
        if self.namespaces_gone(180).await {
            return;
        }
        // kwok gone (it failed, or was never started): nothing finishes the
        // pods' deletion, so do it here.
        eprintln!("namespaces still terminating: force-deleting their pods");
        // One collection delete per namespace, several at once: one by one,
        // 10,000 pods took minutes.
        let force = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        futures_util::stream::iter(&self.namespaces)
            .for_each_concurrent(CREATE_CONCURRENCY, |ns| {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let force = force.clone();
                async move {
                    let _ = pods.delete_collection(&force, &ListParams::default()).await;
                }
            })
            .await;
        if !self.namespaces_gone(120).await {
            eprintln!(
                "warning: some namespaces of {} are still terminating",
                self.name
            );
        }
    }

    async fn namespaces_gone(&self, secs: u64) -> bool {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        kubegrace_e2e::poll(
            "the run's namespaces gone",
            Duration::from_secs(secs),
            Duration::from_secs(2),
            || async {
                let left = nss
                    .list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", self.name)))
                    .await
                    .ok()?
                    .items
                    .len();
                (left == 0).then_some(())
            },
        )
        .await
        .is_ok()
    }

    async fn delete_rest(&self) {
        let dp = DeleteParams::default();
        // A run stopped before the storm's end leaves the null webhook's
        // configuration (cluster-scoped) behind otherwise.
        let _ = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&null_webhook_name(&self.name), &dp)
            .await;
        for n in &self.nodes {
            let _ = Api::<Node>::all(self.client.clone()).delete(n, &dp).await;
        }
        kubegrace_e2e::delete_test_namespace(&self.client, &self.name).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = client().await?;
    let name = format!("kg-bench-scale-{:06x}", rand_suffix());
    let mut run = Run {
        client: client.clone(),
        name: name.clone(),
        namespaces: (0..args.namespaces)
            .map(|i| format!("{name}-{i:04}"))
            .collect(),
        nodes: (0..args.nodes)
            .map(|i| format!("{name}-node-{i:04}"))
            .collect(),
    };
    let kwok_log = std::env::temp_dir().join(format!("{name}-kwok.log"));
    let kwok = tokio::process::Command::new(&args.kwok_bin)
        .args([
            format!(
                "--kubeconfig={}",
                std::env::var("KUBECONFIG").context("KUBECONFIG is not set")?
            ),
            "--manage-all-nodes=false".into(),
            format!("--manage-nodes-with-label-selector={RUN_LABEL}={name}"),
            // Inside the local cluster's pod range, which never leaves the
            // machine (e2e/cluster/up drops it on the way out); the real
            // node uses its first /24.
            "--cidr=10.244.128.0/17".into(),
            // Leases, not status heartbeats, keep the nodes Ready (cheaper).
            "--node-lease-duration-seconds=40".into(),
        ])
        .args(stage_files(&args.kwok_stages)?)
        .stdout(std::fs::File::create(&kwok_log)?)
        .stderr(std::fs::File::create(kwok_log.with_extension("err"))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting kwok ({}): bench/scale builds it", args.kwok_bin))?;
    eprintln!("kwok log {}", kwok_log.display());
    let mut operator = None;
    let outcome = tokio::time::timeout(
        Duration::from_secs(args.deadline),
        scale(&args, &client, &mut run, &mut operator),
    )
    .await;
    eprintln!("cleaning up");
    run.delete_namespaces().await;
    if let Some(op) = operator {
        let _ = op.stop().await;
    }
    drop(kwok);
    run.delete_rest().await;
    // What the operator was changed to do at scale is checked on every run
    // (bench/src/scale_checks.rs): the report is written first, whatever
    // they say, then a broken one fails the run.
    let mut broken = Vec::new();
    let outcome = outcome.map(|r| {
        r.map(|mut report| {
            let checks = scale_checks::checks(&report);
            for c in &checks {
                let value = c.value.map_or("missing".into(), |v| format!("{v:.3}"));
                let verdict = if c.ok() { "ok" } else { "MISSED" };
                eprintln!(
                    "  check {}: {value} (at most {}) {verdict}",
                    c.name, c.bound
                );
            }
            broken = scale_checks::broken(&checks)
                .iter()
                .map(|c| c.name)
                .collect();
            report["checks"] = scale_checks::to_json(&checks);
            report
        })
    });
    write_report(outcome, args.deadline, &args.out)?;
    anyhow::ensure!(
        broken.is_empty(),
        "kept checks broken: {}",
        broken.join("; ")
    );
    Ok(())
}

#[allow(clippy::too_many_lines)] // one linear script: setup, four phases, report
async fn scale(
    args: &Args,
    client: &Client,
    run: &mut Run,
    operator_slot: &mut Option<Operator>,
) -> anyhow::Result<Value> {
    let t0 = Instant::now();
    let name = run.name.clone();
    let pods_wanted = usize::try_from(args.routes * args.pods_per_route)?;
    install_crd(client, &args.crd).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    let labelled = |ns: &str| -> anyhow::Result<Namespace> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": ns, "labels": {"kubegrace.io/test": "bench", RUN_LABEL: name}}
        }))?)
    };
    // The operator's own namespace (Lease, certificate Secret): not served.
    let mut own = labelled(&name)?;
    own.labels_mut().remove(RUN_LABEL);
    nss.create(&PostParams::default(), &own).await?;
    for n in &run.nodes {
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node(n, &name)?)
            .await
            .with_context(|| format!("creating node {n}"))?;
    }
    let [webhook_port, admin_port] = kubegrace_e2e::free_ports::<2>()?;
    let served = json!({"matchLabels": {RUN_LABEL: name}});
    create_mutating_webhook(client, &name, webhook_port, &served).await?;
    create_validating_webhook(client, &name, webhook_port, &served).await?;
    let null_webhook = NullWebhook::start(
        client,
        &args.null_webhook_bin,
        &null_webhook_name(&name),
        &served,
    )
    .await?;

    let bin = operator_bin(args.operator_bin.as_deref());
    let operator = Operator::start(&bin, &name, webhook_port, admin_port, &[], "")?;
    let samples = Arc::new(Mutex::new(Samples::default()));
    let mut sampler = sample(
        operator.pid().context("the operator has no pid")?,
        t0,
        samples.clone(),
    );
    *operator_slot = Some(operator);
    wait_ca_bundle(client, &name).await?;
    for ns in &run.namespaces {
        nss.create(&PostParams::default(), &labelled(ns)?).await?;
    }
    let probe_ns = run.namespaces[0].clone();
    Api::<GraceRoute>::namespaced_with(client.clone(), &probe_ns, &route_resource())
        .create(&PostParams::default(), &probe_route()?)
        .await
        .context("creating the probe route")?;
    let tracker = Tracker::default();
    // Aborted when this function returns, however it returns.
    let _watches: Vec<AbortOnDrop> = tracker
        .spawn(client, &format!("{RUN_LABEL}={name}"))
        .into_iter()
        .map(AbortOnDrop)
        .collect();
    let start_s = t0.elapsed().as_secs_f64();
    eprintln!("[{start_s:6.1}s] setup done; phase 1: the storm");

    // ---- 1. Storm.
    let before = metrics(admin_port).await?;
    let apiserver_before = apiserver_webhook_calls(client, INJECT_WEBHOOK).await?;
    let apiserver_null_before = apiserver_webhook_calls(client, NULL_WEBHOOK).await?;
    let stop_probe = Arc::new(tokio::sync::Notify::new());
    let probe = tokio::spawn(admission_probe(
        Api::namespaced(client.clone(), &probe_ns),
        stop_probe.clone(),
        5000,
    ));
    let storm_t = Instant::now();
    let per_ns = args.routes.div_ceil(args.namespaces);
    // CREATE_CONCURRENCY routes (each with its Deployment) in flight: as fast
    // as the API server takes them, where one at a time measured the
    // client's round trips (200 routes took 40 s).
    let created: HashMap<(String, String), Instant> = futures_util::stream::iter(0..args.routes)
        .map(|i| {
            let (client, name) = (client.clone(), name.clone());
            let ns = run.namespaces[usize::try_from(i / per_ns).unwrap_or(0)].clone();
            async move {
                let r = format!("web-{i:05}");
                let mut gr = route(&r, 1000)?;
                gr.labels_mut().insert(RUN_LABEL.into(), name.clone());
                Api::<GraceRoute>::namespaced_with(client.clone(), &ns, &route_resource())
                    .create(&PostParams::default(), &gr)
                    .await
                    .with_context(|| format!("creating route {ns}/{r}"))?;
                let at = Instant::now();
                Api::<Deployment>::namespaced(client, &ns)
                    .create(
                        &PostParams::default(),
                        &deployment(&r, args.pods_per_route, &name)?,
                    )
                    .await
                    .with_context(|| format!("creating Deployment {ns}/{r}"))?;
                anyhow::Ok(((ns, r), at))
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let applied = storm_t.elapsed();
    eprintln!("  applied in {:.1}s", applied.as_secs_f64());
    let storm = until_current(client, &tracker, &name, args, "storm").await?;
    stop_probe.notify_one();
    let probes = probe.await??;
    let apiserver_null_call = apiserver_webhook_calls(client, NULL_WEBHOOK)
        .await?
        .since(&apiserver_null_before);
    null_webhook.remove(client).await;
    let after = metrics(admin_port).await?;
    let apiserver_call = apiserver_webhook_calls(client, INJECT_WEBHOOK)
        .await?
        .since(&apiserver_before);
    let storm_requests = per_reconcile(&before, &after);
    let storm_waits = tracker.waits(storm_t, &created, &HashMap::new());
    let webhook_server =
        Histogram::parse(&after, "kubegrace_operator_webhook_duration_seconds").since(
            &Histogram::parse(&before, "kubegrace_operator_webhook_duration_seconds"),
        );
    let storm_end_s = t0.elapsed().as_secs_f64();

    // ---- 2. Steady.
    eprintln!("[{storm_end_s:6.1}s] phase 2: steady (30s)");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let steady_end_s = t0.elapsed().as_secs_f64();
    let reconciles_steady = {
        let a = metrics(admin_port).await?;
        kubegrace_bench::operator_rig::counter(&a, "kubegrace_operator_reconcile_total")
            - kubegrace_bench::operator_rig::counter(&after, "kubegrace_operator_reconcile_total")
    };

    // ---- 3. Cold start: stop, edit every route, start, time until current.
    eprintln!("[{steady_end_s:6.1}s] phase 3: cold start");
    if let Some(op) = operator_slot.take() {
        op.stop().await?;
    }
    sampler.abort();
    let generations = tracker.generations();
    for i in 0..args.routes {
        let ns = &run.namespaces[usize::try_from(i / per_ns)?];
        Api::<GraceRoute>::namespaced_with(client.clone(), ns, &route_resource())
            .patch(
                &format!("web-{i:05}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"drain": {"quiet": "1100ms"}}})),
            )
            .await
            .context("editing a route while the operator is down")?;
    }
    let restart_s = t0.elapsed().as_secs_f64();
    let restart_t = Instant::now();
    let operator = Operator::start(&bin, &name, webhook_port, admin_port, &[], "-2")?;
    sampler = sample(
        operator.pid().context("the operator has no pid")?,
        t0,
        samples.clone(),
    );
    *operator_slot = Some(operator);
    let cold = until_current(client, &tracker, &name, args, "cold start").await?;
    let cold_end_s = t0.elapsed().as_secs_f64();
    let cold_waits = tracker.waits(restart_t, &HashMap::new(), &generations);
    // The new process counted from 0: its requests so far are the cold start's.
    let cold_requests = per_reconcile("", &metrics(admin_port).await?);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let cold_steady_s = t0.elapsed().as_secs_f64();

    // ---- 4. Rolling restart of every Deployment at once.
    let roll = if args.rolling_restart {
        eprintln!("[{cold_steady_s:6.1}s] phase 4: rolling restart of every Deployment");
        Some(rolling_restart(args, client, &tracker, &run.namespaces, &name, admin_port).await?)
    } else {
        None
    };
    let after = metrics(admin_port).await?;
    let reconcile_all = Histogram::parse(&after, "kubegrace_operator_reconcile_duration_seconds");
    let end_s = t0.elapsed().as_secs_f64();
    sampler.abort();

    let version = client.apiserver_version().await?;
    let samples = samples
        .lock()
        .map_err(|_| anyhow::anyhow!("sampler poisoned"))?;
    let secs = |d: Duration| (d.as_secs_f64() * 10.0).round() / 10.0;
    Ok(json!({
        "what": "kubegrace-operator (release binary on this host) against the local cluster's API server, with kwok playing the kubelets of fake nodes; the real scheduler and controller-manager",
        "kubernetes": version.git_version,
        "machine_cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        // e2e/cluster/up's KG_CONTROL_PLANE_QPS of the cluster that ran (its default when absent).
        "control_plane_client_qps": std::env::var("KG_CONTROL_PLANE_QPS_RUNNING").unwrap_or_else(|_| "unknown".into()),
        "nodes": args.nodes,
        "namespaces": args.namespaces,
        "routes": args.routes,
        "pods": pods_wanted,
        "storm": {
            "how": "every route and Deployment created as fast as the API server takes them; until every pod is injected and Ready and every route Ready at its generation",
            "applied_seconds": secs(applied),
            "all_current_seconds": secs(storm),
            "operator": samples.window(start_s, storm_end_s),
            "admission_during_storm": added(&probes.injected, &probes.bare),
            "admission_during_storm_unrouted": added(&probes.unrouted, &probes.bare),
            // A webhook that admits every pod unchanged (bench-null-webhook,
            // release build): what any webhook costs here, and what
            // kubegrace's injection adds beyond that.
            "admission_during_storm_null_webhook": added(&probes.null, &probes.bare),
            "kubegrace_over_null_webhook": added(&probes.injected, &probes.null),
            "apiserver_null_webhook_call_histogram": apiserver_null_call.json(),
            "operator_webhook_histogram": webhook_server.json(),
            // The same calls as the API server times them (its request out to
            // the webhook and the answer back): what the handler's own
            // histogram leaves out is the transport and the wait for a CPU.
            "apiserver_webhook_call_histogram": apiserver_call.json(),
            "route_wait": storm_waits,
            "api_requests": storm_requests,
        },
        "steady": {
            "operator": samples.window(storm_end_s + 10.0, steady_end_s),
            "reconciles_in_30s": reconciles_steady,
        },
        "cold_start": {
            "how": "operator stopped, every route edited (drain.quiet), operator started; until every route's status is at its new generation",
            "all_current_seconds": secs(cold),
            "operator_catching_up": samples.window(restart_s, cold_end_s),
            "operator_steady_after": samples.window(cold_end_s + 10.0, cold_steady_s),
            "route_wait": cold_waits,
            "api_requests": cold_requests,
        },
        "rolling_restart": roll.map_or(json!(null), |(took, webhook, requests)| json!({
            "how": "every Deployment's template annotated at once (kubectl rollout restart); until every Deployment is rolled out and every route current",
            "all_current_seconds": secs(took),
            "operator": samples.window(cold_steady_s, end_s),
            "operator_webhook_histogram": webhook.json(),
            "api_requests": requests,
        })),
        "reconcile_histogram_since_cold_start": reconcile_all.json(),
        "total_seconds": secs(t0.elapsed()),
    }))
}

/// Phase 4: every Deployment restarted at once (`kubectl rollout restart`);
/// the time until every one is rolled out and every route current, and the
/// webhook's histogram meanwhile.
async fn rolling_restart(
    args: &Args,
    client: &Client,
    tracker: &Tracker,
    namespaces: &[String],
    name: &str,
    admin_port: u16,
) -> anyhow::Result<(Duration, Histogram, Value)> {
    let per_ns = args.routes.div_ceil(args.namespaces);
    let t0 = Instant::now();
    let before = metrics(admin_port).await?;
    let old = tracker.deployment_generations();
    let roll_t = Instant::now();
    let stamp = format!("{}", t0.elapsed().as_millis());
    for i in 0..args.routes {
        let ns = &namespaces[usize::try_from(i / per_ns)?];
        Api::<Deployment>::namespaced(client.clone(), ns)
            .patch(
                &format!("web-{i:05}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": stamp}}}}})),
            )
            .await
            .context("restarting a Deployment")?;
    }
    // The watch has seen every Deployment's new generation (before that it
    // could still call the old one rolled out).
    wait_for(
        args.phase_timeout,
        "the restarts seen by the watch",
        || async {
            let now = tracker.deployment_generations();
            let newer = old.iter().all(|(k, g)| now.get(k).is_some_and(|n| n > g));
            newer.then_some(())
        },
    )
    .await?;
    let rolled = until_current(client, tracker, name, args, "rolling restart")
        .await
        .map(|_| roll_t.elapsed())?;
    let after = metrics(admin_port).await?;
    let webhook = Histogram::parse(&after, "kubegrace_operator_webhook_duration_seconds").since(
        &Histogram::parse(&before, "kubegrace_operator_webhook_duration_seconds"),
    );
    Ok((rolled, webhook, per_reconcile(&before, &after)))
}
