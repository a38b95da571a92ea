//! Drain outcomes outlive the pod: each sidecar leaves its drain report as its
//! container's termination message, and the operator totals them per route.
//!
//! On the real cluster: the chart installed with the local images, the demo app (three
//! replicas, injected) behind a GraceRoute whose `drain.timeout` is 4s. One request that
//! takes a minute is started straight on one pod (the sidecar's port), and the Deployment
//! is rolled (`kubectl rollout restart`) under the scenario's constant load. Once the old
//! pods are gone:
//!
//! - the long request was cut (the drain closed it at the deadline): the loss a too-short
//!   `drain.timeout` causes, and what the report must show;
//! - the route's `status.lastDrains` counts exactly three pods, one force-closed (with the
//!   cut request) and two clean, and `kubectl get groute` shows `1/3 force-closed` in its
//!   LastDrains column (the API server's Table, the printer columns as kubectl gets them);
//! - the operator's `kubegrace_operator_pod_drains_total` says the same (one force_closed,
//!   two clean), read from its `/metrics` through the API server's pod proxy;
//! - a `DrainForceClosed` Warning Event names the route and another the Deployment.
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use kubegrace_e2e::scenario::kit::{self, Session};
use kubegrace_e2e::scenario::{
    Action, Options, Progress, Scenario, events_for, keep_from_env, with_install,
};
use serde_json::json;

const NAME: &str = "drains";
/// Far beyond the drain timeout: this request is cut by its pod's drain.
const LONG_MS: u64 = 60_000;
const SESSION_TIMEOUT: Duration = Duration::from_secs(120);
/// The operator's admin port (the chart's `operator.ports.admin`).
const OPERATOR_ADMIN_PORT: u16 = 8080;

#[tokio::test]
async fn a_rollout_with_one_request_past_the_drain_timeout_shows_one_force_closed_drain()
-> Result<()> {
    let test = "a_rollout_with_one_request_past_the_drain_timeout_shows_one_force_closed_drain";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let opts = Options::lossy_drain("kg-drains")?;
    let p = Progress::default();
    let found = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("drains").await?;
        kit::deploy_with_route(&sc, NAME, json!({}), &p).await?;
        let long = start_long_request(&sc, &p).await?;
        let rolled = sc.roll_under_load(NAME, Action::Restart, &p).await?;
        let long = long.await.context("the long request's task")?;
        p.step(format!("long request: {long}"));
        let status =
            kit::wait_last_drains(&sc, NAME, 3, &p).await?.data["status"]["lastDrains"].clone();
        let column = printer_column(&client, &sc.namespace, "LastDrains").await?;
        let counters = operator_counters(&sc, &p).await?;
        let events = drain_events(&client, &sc.namespace).await?;
        Ok(Found {
            long,
            failed_under_load: rolled.summary.failed,
            status,
            column,
            counters,
            events,
        })
    })
    .await?;

    eprintln!("lastDrains: {}", found.status);
    eprintln!("LastDrains column: {:?}", found.column);
    eprintln!("operator counters: {:?}", found.counters);
    eprintln!("DrainForceClosed events on: {:?}", found.events);
    ensure!(
        !found.long.finished(),
        "the request longer than drain.timeout finished, so no drain was forced: {}",
        found.long
    );
    let s = &found.status;
    ensure!(
        (
            s["pods"].as_i64(),
            s["forceClosed"].as_i64(),
            s["clean"].as_i64()
        ) == (Some(3), Some(1), Some(2)),
        "status.lastDrains should count 3 pods, 1 force-closed, 2 clean: {s}"
    );
    ensure!(
        s["requestsCut"].as_i64().unwrap_or(0) >= 1,
        "the cut request is not in status.lastDrains: {s}"
    );
    ensure!(
        found.column.as_deref() == Some("1/3 force-closed"),
        "kubectl get groute LastDrains: {:?}",
        found.column
    );
    ensure!(
        found.counters == (2, 1),
        "kubegrace_operator_pod_drains_total (clean, force_closed) = {:?}, want (2, 1)",
        found.counters
    );
    for kind in ["GraceRoute", "Deployment"] {
        ensure!(
            found.events.iter().any(|k| k == kind),
            "no DrainForceClosed Event on the {kind}: {:?}",
            found.events
        );
    }
    // Not a zero-loss test, but the rest of the rollout still loses nothing.
    ensure!(
        found.failed_under_load == 0,
        "{} requests of the constant load failed during the rollout",
        found.failed_under_load
    );
    Ok(())
}

struct Found {
    long: Session,
    failed_under_load: u64,
    status: serde_json::Value,
    column: Option<String>,
    /// (clean, force_closed) for this route, summed over the operator's pods.
    counters: (u64, u64),
    /// Kinds of the objects a DrainForceClosed Event is about.
    events: Vec<String>,
}

/// Starts the long request on one ready pod (through its sidecar) and waits until the app
/// reports it in flight; the task ends when the request does.
async fn start_long_request(
    sc: &Scenario,
    p: &Progress,
) -> Result<tokio::task::JoinHandle<Session>> {
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let ready = kit::ready_pods(&pods, NAME).await?;
    let pod = ready.into_iter().next().context("no ready pod")?;
    kit::start_long_request(&pod, LONG_MS, SESSION_TIMEOUT, p).await
}

/// The route's printer column `name`, as `kubectl get groute` shows it: the API server's
/// Table rendering of the CRD's additionalPrinterColumns.
async fn printer_column(client: &Client, ns: &str, name: &str) -> Result<Option<String>> {
    let url = format!("/apis/kubegrace.io/v1alpha1/namespaces/{ns}/graceroutes/{NAME}");
    let req = http::Request::get(url.as_str())
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())?;
    let table: serde_json::Value = serde_json::from_str(
        &client
            .request_text(req)
            .await
            .with_context(|| format!("GET {url} as Table"))?,
    )?;
    let columns = table["columnDefinitions"]
        .as_array()
        .context("no columnDefinitions: not a Table")?;
    let index = columns
        .iter()
        .position(|c| c["name"] == name)
        .with_context(|| format!("no column {name} in {columns:?}"))?;
    Ok(table["rows"][0]["cells"][index]
        .as_str()
        .map(str::to_string))
}

/// (clean, force_closed) drains of this route, summed over the operator pods' `/metrics`
/// (only the leader counts; a replica that led before would show its own).
async fn operator_counters(sc: &Scenario, p: &Progress) -> Result<(u64, u64)> {
    let (pods, _) = sc.operator_pods().await?;
    let route = format!("{}/{NAME}", sc.namespace);
    let mut sums = (0, 0);
    for (pod, _) in pods {
        let url = format!(
            "/api/v1/namespaces/{}/pods/{pod}:{OPERATOR_ADMIN_PORT}/proxy/metrics",
            sc.opts.release_namespace
        );
        let req = http::Request::get(url.as_str()).body(Vec::new())?;
        let text = sc
            .client
            .request_text(req)
            .await
            .with_context(|| format!("GET {url}"))?;
        let value = |outcome: &str| -> u64 {
            let series = format!(
                "kubegrace_operator_pod_drains_total{{route=\"{route}\",outcome=\"{outcome}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map_or(0, |v| v as u64)
        };
        p.step(format!(
            "operator {pod}: {route} clean {} force_closed {}",
            value("clean"),
            value("force_closed")
        ));
        sums.0 += value("clean");
        sums.1 += value("force_closed");
    }
    Ok(sums)
}

/// The kinds of the objects the namespace's DrainForceClosed Events are about.
async fn drain_events(client: &Client, ns: &str) -> Result<Vec<String>> {
    Ok(events_for(client, ns, "DrainForceClosed")
        .await?
        .into_iter()
        .filter_map(|e| e.involved_object.kind)
        .collect())
}
