//! Operator benchmark against the real local cluster: admission latency of
//! the sidecar-injection webhook and of the GraceRoute validating webhook,
//! and reconcile time (GraceRoute edit -> status caught up), next to the
//! operator's own `/metrics` histograms.
//!
//! The operator is the release binary `e2e/cluster/with-cluster` builds
//! (`--operator-bin`), run on this host as `e2e/tests/operator_api` runs
//! it in-process: the API server calls its webhooks by URL on 127.0.0.1
//! over TLS, with the caBundle the operator patches in itself. Everything it creates lives in
//! one labelled namespace plus two webhook configurations named after it,
//! all deleted at the end (also on failure).
//!
//! Run under the session lock, e.g.
//!   e2e/cluster/with-cluster cargo run -p kubegrace-bench \
//!     --features operator --bin bench-operator
//! (`make bench-operator`). The client side needs no release build: what is
//! timed is the API server and the operator.
//! Every loop is bounded in count and in time (`--deadline`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures_util::StreamExt as _;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};
use kubegrace_bench::operator_rig::{
    GraceRoute, Histogram, Operator, Series, client, condition, counter, create_mutating_webhook,
    create_validating_webhook, install_crd, metrics, operator_bin, rand_suffix, route_resource,
    wait_ca_bundle, wait_for, write_report,
};
use kubegrace_sidecar_api::keys;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "kubegrace-operator: webhook latency and reconcile time on the local cluster")]
struct Args {
    /// Pod creates (dryRun=All) per admission series.
    #[arg(long, default_value_t = 200)]
    pods: usize,
    /// GraceRoute creates (dryRun=All) per validation series.
    #[arg(long, default_value_t = 200)]
    routes: usize,
    /// GraceRoute edits timed to status caught up.
    #[arg(long, default_value_t = 30)]
    edits: usize,
    /// Upper bound of the whole run, seconds.
    #[arg(long, default_value_t = 300)]
    deadline: u64,
    /// Where the JSON goes.
    #[arg(long, default_value = "bench/results/operator.json")]
    out: String,
    /// The operator binary; default: the static release build of
    /// e2e/cluster/with-cluster in $CARGO_TARGET_DIR.
    #[arg(long, env = "KUBEGRACE_OPERATOR_BIN")]
    operator_bin: Option<String>,
    /// The CRD to install (what `kubegrace-operator crd` prints).
    #[arg(long, default_value = "crds/graceroutes.kubegrace.io.yaml")]
    crd: String,
}

fn pod(injected: bool) -> anyhow::Result<Pod> {
    let mut labels = json!({"app": "web"});
    if injected {
        labels[keys::INJECT] = json!("enabled");
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"generateName": "bench-", "labels": labels, "annotations": { (keys::ROUTE): "web" }},
        "spec": {"containers": [{
            "name": "app", "image": "localhost/kubegrace/pause:e2e", "imagePullPolicy": "Never",
            "ports": [{"name": "http", "containerPort": 8080}]
        }]}
    }))?)
}

fn route(name: &str, quiet_ms: u64) -> anyhow::Result<GraceRoute> {
    let port = "http";
    Ok(serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name},
        "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": port}],
                 "drain": {"quiet": format!("{quiet_ms}ms")}}
    }))?)
}

/// Times `n` dry-run creates of a route, after 10 untimed ones that warm the path up.
async fn time_dry_run_routes(
    routes: &Api<GraceRoute>,
    n: usize,
    what: &str,
) -> anyhow::Result<Series> {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut series = Series::default();
    for i in 0..n + 10 {
        let t = Instant::now();
        routes
            .create(&dry, &route(&format!("dry-{i}"), 1000)?)
            .await
            .context(what.to_owned())?;
        if i >= 10 {
            series.push(t.elapsed());
        }
    }
    Ok(series)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = client().await?;
    let ns = format!("kg-bench-op-{:06x}", rand_suffix());
    let outcome =
        tokio::time::timeout(Duration::from_secs(args.deadline), run(&args, &client, &ns)).await;
    // Also on failure: the namespace, and the webhook configurations named after it.
    kubegrace_e2e::delete_test_namespace(&client, &ns).await;
    write_report(outcome, args.deadline, &args.out)
}

#[allow(clippy::too_many_lines)] // one linear script: setup, three series, report
async fn run(args: &Args, client: &Client, ns: &str) -> anyhow::Result<Value> {
    let started = Instant::now();
    install_crd(client, &args.crd).await?;

    let namespace: Namespace = serde_json::from_value(
        json!({"metadata": {"name": ns, "labels": {"kubegrace.io/test": "bench"}}}),
    )?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .context("creating the namespace")?;
    let [webhook_port, admin_port] = kubegrace_e2e::free_ports::<2>()?;
    let selector = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    create_mutating_webhook(client, ns, webhook_port, &selector).await?;

    let bin = operator_bin(args.operator_bin.as_deref());
    let operator = Operator::start(&bin, ns, webhook_port, admin_port, &[], "")?;
    wait_ca_bundle(client, ns).await?;

    // The workload and its route. No replicas: the reconcile does all its
    // work (ConfigMap, rollout fields, pod count) without pods churning on
    // the shared cluster; Ready stays False (InjectionNotEnabled: no pod
    // asks), which is what a status update must say.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web", (keys::INJECT): "enabled"}},
                              "spec": {"containers": [{"name": "app", "image": "localhost/kubegrace/pause:e2e",
                                       "imagePullPolicy": "Never", "ports": [{"name": "http", "containerPort": 8080}]}]}}}
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .context("creating the Deployment")?;
    let routes: Api<GraceRoute> = Api::namespaced_with(client.clone(), ns, &route_resource());
    routes
        .create(&PostParams::default(), &route("web", 1000)?)
        .await
        .context("creating the GraceRoute")?;
    wait_for(120, "route web Accepted", || async {
        let r = routes.get("web").await.ok()?;
        condition(&r, "Accepted")
            .is_some_and(|(status, _)| status == "True")
            .then_some(())
    })
    .await?;
    eprintln!("[{:5.1}s] setup done", started.elapsed().as_secs_f64());

    // ---- 1. Pod admission: the same pod, sent to the webhook or not.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let before = metrics(admin_port).await?;
    let (mut with_hook, mut without_hook) = (Series::default(), Series::default());
    let (bare, asking) = (pod(false)?, pod(true)?);
    // Interleaved, so both series see the same machine noise.
    for i in 0..args.pods + 10 {
        for (p, series) in [(&bare, &mut without_hook), (&asking, &mut with_hook)] {
            let t = Instant::now();
            let created = pods.create(&dry, p).await.context("dry-run pod create")?;
            // The first rounds warm connections and caches; not counted.
            if i >= 10 {
                series.push(t.elapsed());
            }
            let injected = created.annotations().contains_key(keys::INJECTED);
            if injected != std::ptr::eq(p, &asking) {
                bail!(
                    "pod {i}: injected={injected}, the webhook did not do what the series assumes"
                );
            }
        }
    }
    let after = metrics(admin_port).await?;
    let mutate_server =
        Histogram::parse(&after, "kubegrace_operator_webhook_duration_seconds").since(
            &Histogram::parse(&before, "kubegrace_operator_webhook_duration_seconds"),
        );
    eprintln!(
        "[{:5.1}s] pod admission done",
        started.elapsed().as_secs_f64()
    );

    // ---- 2. GraceRoute admission: dry-run creates before and after the
    // validating webhook exists.
    let route_without = time_dry_run_routes(&routes, args.routes, "dry-run route create").await?;
    create_validating_webhook(client, ns, webhook_port, &selector).await?;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    wait_for(60, "the validating webhook answering", || async {
        let ok = vwcs
            .get(ns)
            .await
            .ok()?
            .webhooks?
            .iter()
            .all(|w| w.client_config.ca_bundle.is_some());
        // A refusal proves the operator answered: a grace period pinned
        // below any budget is refused whatever the target.
        let mut probe = route("probe", 1000).ok()?;
        probe.data["spec"]["rollout"] = json!({"terminationGracePeriodSeconds": 1});
        let answered = ok
            && matches!(routes.create(&dry, &probe).await,
                Err(e) if e.to_string().contains("BudgetDoesNotFit"));
        answered.then_some(())
    })
    .await?;
    let before = metrics(admin_port).await?;
    let route_with = time_dry_run_routes(
        &routes,
        args.routes,
        "dry-run route create through the webhook",
    )
    .await?;
    let after = metrics(admin_port).await?;
    let validate_server = Histogram::parse(
        &after,
        "kubegrace_operator_route_validation_duration_seconds",
    )
    .since(&Histogram::parse(
        &before,
        "kubegrace_operator_route_validation_duration_seconds",
    ));
    eprintln!(
        "[{:5.1}s] route admission done",
        started.elapsed().as_secs_f64()
    );

    // ---- 3. Reconcile: edit the route (drain.quiet: a config change, no
    // roll), time until status.observedGeneration and the observedGeneration
    // of Accepted, Ready and Degraded reach the new generation.
    let before = metrics(admin_port).await?;
    let reconciles_before = counter(&before, "kubegrace_operator_reconcile_total");
    let mut reconcile = Series::default();
    let mut stream = Box::pin(watcher::watch_object(routes.clone(), "web"));
    for i in 0..args.edits {
        let t = Instant::now();
        let patched = routes
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"drain": {"quiet": format!("{}ms", 1100 + i * 10)}}}),
                ),
            )
            .await
            .context("editing the route")?;
        let generation = patched.metadata.generation.unwrap_or_default();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next())
                .await
                .with_context(|| format!("edit {i}: status not caught up in 30s"))?;
            let Some(Ok(Some(r))) = next else { continue };
            let caught_up = r.data["status"]["observedGeneration"].as_i64() == Some(generation)
                && ["Accepted", "Ready", "Degraded"]
                    .iter()
                    .all(|t| condition(&r, t).is_some_and(|(_, g)| g == Some(generation)));
            if caught_up {
                reconcile.push(t.elapsed());
                break;
            }
        }
    }
    // Passes per edit: each status write is itself a watch event, so an
    // edit costs more than one pass; this counts them.
    let after = metrics(admin_port).await?;
    let reconcile_server =
        Histogram::parse(&after, "kubegrace_operator_reconcile_duration_seconds").since(
            &Histogram::parse(&before, "kubegrace_operator_reconcile_duration_seconds"),
        );
    let reconciles = counter(&after, "kubegrace_operator_reconcile_total") - reconciles_before;
    eprintln!("[{:5.1}s] reconcile done", started.elapsed().as_secs_f64());

    operator.stop().await?;

    let version = client.apiserver_version().await?;
    Ok(json!({
        "what": "kubegrace-operator on the local single-node cluster; the release operator binary on the host, API server -> webhook over TLS by URL",
        "kubernetes": version.git_version,
        "machine_cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "pod_admission": {
            "how": "pod create dryRun=All from this process, ms; the same pod with and without the label that sends it to the mutating webhook, interleaved; 10 warm-up rounds not counted",
            "with_webhook": with_hook.json(),
            "without_webhook": without_hook.json(),
            "added_p50_ms": ((with_hook.pct(0.5) - without_hook.pct(0.5)) * 1000.0).round() / 1000.0,
            "added_p99_ms": ((with_hook.pct(0.99) - without_hook.pct(0.99)) * 1000.0).round() / 1000.0,
            "operator_histogram": mutate_server.json(),
        },
        "route_admission": {
            "how": "GraceRoute create dryRun=All, ms; before and after the validating webhook exists (series in sequence)",
            "with_webhook": route_with.json(),
            "without_webhook": route_without.json(),
            "added_p50_ms": ((route_with.pct(0.5) - route_without.pct(0.5)) * 1000.0).round() / 1000.0,
            "operator_histogram": validate_server.json(),
        },
        "reconcile": {
            "how": "merge patch of spec.drain.quiet (config change, no roll) until a watch sees status.observedGeneration and the observedGeneration of Accepted, Ready and Degraded at the new generation, ms; target Deployment with 0 replicas",
            "edit_to_status": reconcile.json(),
            "reconciles_during_edits": reconciles,
            "operator_histogram": reconcile_server.json(),
        },
        "histogram_note": "operator_histogram: from /metrics before and after the series; p50/p99 are the bucket bounds they fall under (buckets 1, 2.5, 5, 10, 25, 50, 100 ms, ...)",
        "total_seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    }))
}
