//! The circuit breaker, on a real cluster.
//!
//! The chart installed with the local images; the demo app (2 replicas) annotated
//! `kubegrace.io/inject=enabled` with a GraceRoute that puts a breaker and a fallback on the
//! route `api` (`/api/...`) only. A constant load of `GET /api/items` goes through the
//! Service's ClusterIP from this host. Then, each step a condition wait:
//! 1. fault off: every answer is the app's 200;
//! 2. the app's fault switch flipped on every pod (`POST /fault?status=503` on the app's own
//!    port): each sidecar's breaker opens (`GET /breakers` on its admin port);
//! 3. while open: clients get the fallback (200, `x-kubegrace-fallback: breaker_open`, the
//!    route's body), and the app sees only the half-open probes: its `/stats` count of
//!    `/api` requests grows by at most the sidecars' half-open transitions, while the load
//!    sends far more; a path outside the route (`GET /`) still reaches the app (503);
//! 4. fault off: a probe succeeds, every breaker closes, and every request sent after that
//!    is the app's 200 again.
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use kubegrace_e2e::scenario::kit::{self, ConstantLoad, PodAddr, Tally, stat};
use kubegrace_e2e::scenario::{Options, Patience, Progress, Scenario, keep_from_env, with_install};
use kubegrace_sidecar_api::config::FALLBACK_HEADER;
use serde_json::json;

const APP: &str = "demo-breaker";
const ROUTE: &str = "api";
const FALLBACK_BODY: &str = r#"{"items":[],"degraded":true}"#;
/// Requests per second of the load.
const RATE: f64 = 40.0;
/// Half-open probes per half-open period (the route's `halfOpenProbes`).
const PROBES: u64 = 1;

// Phases of the load (see `ConstantLoad::set_phase`).
const HEALTHY: usize = 0;
const FAULTING: usize = 1;
const OPEN: usize = 2;
const RECOVERING: usize = 3;
const RECOVERED: usize = 4;

#[tokio::test]
async fn an_open_breaker_serves_the_fallback_lets_only_probes_through_and_closes_on_recovery()
-> Result<()> {
    let test =
        "an_open_breaker_serves_the_fallback_lets_only_probes_through_and_closes_on_recovery";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let mut opts = Options::new("kg-breaker");
    opts.replicas = 2;
    let p = Progress::default();
    with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("rollout").await?;
        let routes = json!({"routes": [{
            "name": ROUTE,
            "match": {"pathPrefix": "/api"},
            "failOn": ["5xx"],
            "circuitBreaker": {
                "consecutiveFailures": 5, "errorRatio": 0.5, "minRequests": 10, "window": "5s",
                "openFor": "1s", "maxOpenFor": "2s", "halfOpenProbes": PROBES,
                "maxConcurrent": 64, "maxQueue": 64, "queueTimeout": "1s",
            },
            "fallback": {"status": 200, "contentType": "application/json", "body": FALLBACK_BODY},
        }]});
        kit::deploy_with_route(&sc, APP, routes, &p).await?;
        breaker_phases(&client, &sc, &p).await
    })
    .await
}

/// The `/api` requests each pod's app has seen, summed.
async fn app_requests(pods: &[PodAddr]) -> std::result::Result<u64, String> {
    let mut total = 0;
    for pod in pods {
        let s = kit::app_stats(&pod.app())
            .await
            .map_err(|e| format!("{e:#}"))?;
        total += stat(&s, "/api", "requests");
    }
    Ok(total)
}

/// Every pod's breaker of the route: (state, half-open transitions so far).
async fn breakers(pods: &[PodAddr]) -> std::result::Result<Vec<(String, u64)>, String> {
    let mut out = Vec::new();
    for pod in pods {
        let admin = pod
            .admin()
            .ok_or_else(|| format!("pod {} has no sidecar admin port", pod.name))?;
        let b = kit::breaker(&admin, ROUTE)
            .await
            .map_err(|e| format!("{e:#}"))?;
        out.push((
            b["breaker"]["state"].as_str().unwrap_or("none").to_owned(),
            b["transitions"]["half_open"].as_u64().unwrap_or(0),
        ));
    }
    Ok(out)
}

/// The half-open transitions of every pod's breaker, summed: each one let a probe through.
async fn half_open_probes(pods: &[PodAddr]) -> std::result::Result<u64, String> {
    Ok(breakers(pods).await?.iter().map(|(_, n)| n).sum())
}

/// Flips the fault switch of every pod's app (`Some(status)` on, `None` off), straight to
/// the app (the sidecar is not asked), then waits until every pod's breaker is in a state
/// `settled` accepts (`breakers_are` says which, for the log).
async fn switch_faults(
    pods: &[PodAddr],
    fault: Option<u16>,
    breakers_are: &str,
    settled: impl Fn(&str) -> bool,
    p: &Progress,
) -> Result<()> {
    for pod in pods {
        kit::set_fault(&pod.app(), fault).await?;
    }
    p.step(match fault {
        Some(status) => format!("fault switch on: every pod's app answers {status}"),
        None => "fault switch off".to_owned(),
    });
    p.wait(
        &format!("every pod's breaker {breakers_are}"),
        Patience::new(Duration::from_secs(30), Duration::from_millis(100)),
        || async {
            let b = breakers(pods).await?;
            if b.iter().all(|(state, _)| settled(state)) {
                Ok(())
            } else {
                Err(format!("breakers {b:?}"))
            }
        },
    )
    .await
}

/// Waits until the load's tally of `phase` is `enough`.
async fn wait_tally(
    load: &ConstantLoad,
    phase: usize,
    what: &str,
    enough: impl Fn(&Tally) -> bool,
    p: &Progress,
) -> Result<()> {
    p.wait(
        what,
        Patience::new(Duration::from_secs(30), Duration::from_millis(200)),
        || async {
            let t = load.tally(phase);
            if enough(&t) {
                Ok(())
            } else {
                Err(format!("{t:?}"))
            }
        },
    )
    .await
}

async fn breaker_phases(client: &Client, sc: &Scenario, p: &Progress) -> Result<()> {
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &sc.namespace);
    let pods = kit::ready_pods(&pod_api, APP).await?;
    ensure!(
        pods.len() == 2 && pods.iter().all(|p| p.admin_port.is_some()),
        "want 2 ready pods with the sidecar, got {pods:?}"
    );
    let service = sc.service_addr(APP).await?;
    p.step(format!(
        "load: {RATE}/s GET /api/items on {service}, a new connection each"
    ));
    let load = ConstantLoad::start(
        service.clone(),
        "/api/items".into(),
        RATE,
        Duration::from_secs(150),
    );

    // 1. Healthy.
    wait_tally(
        &load,
        HEALTHY,
        "50 answers from the healthy app",
        |t| t.ok >= 50,
        p,
    )
    .await?;
    let healthy = load.tally(HEALTHY);
    load.set_phase(FAULTING);

    // 2. Fault on every pod.
    switch_faults(
        &pods,
        Some(503),
        "open",
        |state| state != "closed" && state != "none",
        p,
    )
    .await?;
    load.set_phase(OPEN);

    // 3. Open: fallbacks, and only probes reach the app.
    let app_before = app_requests(&pods).await.map_err(anyhow::Error::msg)?;
    let probes_before = half_open_probes(&pods).await.map_err(anyhow::Error::msg)?;
    p.wait(
        "150 requests sent with the breakers open, and at least 2 half-open probes",
        Patience::new(Duration::from_secs(60), Duration::from_millis(200)),
        || async {
            let t = load.tally(OPEN);
            let probes = half_open_probes(&pods).await?;
            if t.done() >= 150 && probes >= probes_before + 2 {
                Ok(())
            } else {
                Err(format!(
                    "{} answered, {} half-open transitions",
                    t.done(),
                    probes.saturating_sub(probes_before)
                ))
            }
        },
    )
    .await?;
    // The app count first, then the transitions: a probe the app saw before its count was
    // read had its transition counted too. At the start one probe per pod may straddle the
    // two reads (its transition before, its arrival after), hence the slack in the bound.
    let app_after = app_requests(&pods).await.map_err(anyhow::Error::msg)?;
    let probes_after = half_open_probes(&pods).await.map_err(anyhow::Error::msg)?;
    let (status, headers, body) = kit::http1(&service, "GET", "/", Duration::from_secs(5)).await?;
    let outside_route = (status, headers.contains_key(FALLBACK_HEADER), body);
    let (status, headers, body) =
        kit::http1(&service, "GET", "/api/items", Duration::from_secs(5)).await?;
    let fallback_seen = (
        status,
        headers
            .get(FALLBACK_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
    );
    let open = load.tally(OPEN);
    let app_seen = app_after.saturating_sub(app_before);
    let probes = probes_after.saturating_sub(probes_before);
    load.set_phase(RECOVERING);

    // 4. Recovery.
    switch_faults(&pods, None, "closed", |state| state == "closed", p).await?;
    load.set_phase(RECOVERED);
    wait_tally(
        &load,
        RECOVERED,
        "100 answers after the breakers closed",
        |t| t.done() >= 100,
        p,
    )
    .await?;
    let tallies = load.stop().await;
    let recovered = tallies[RECOVERED];

    let show = |name: &str, t: &Tally| {
        eprintln!(
            "{name:<11} sent {:>4}: ok {:>4}, fallback(breaker_open) {:>4}, fallback(other) {}, \
             error status {:>3}, no answer {}",
            t.sent,
            t.ok,
            t.fallback_breaker_open,
            t.fallback_other,
            t.error_status,
            t.transport_error
        );
    };
    show("healthy", &healthy);
    show("faulting", &tallies[FAULTING]);
    show("open", &open);
    show("recovering", &tallies[RECOVERING]);
    show("recovered", &recovered);
    eprintln!(
        "while open: the apps saw {app_seen} /api requests, the sidecars made {probes} \
         half-open transitions ({PROBES} probe each), the load sent {}",
        open.sent
    );
    eprintln!("outside the route while open: {outside_route:?}; on the route: {fallback_seen:?}");

    ensure!(
        healthy.ok == healthy.done(),
        "before the fault some requests failed: {healthy:?}"
    );
    ensure!(
        open.ok == 0 && open.transport_error == 0 && open.fallback_other == 0,
        "with the breakers open, want only fallbacks and failed probes: {open:?}"
    );
    let bound = probes * PROBES + pods.len() as u64;
    ensure!(
        open.fallback_breaker_open >= 100,
        "with the breakers open, want the fallback for nearly every request: {open:?}"
    );
    ensure!(
        app_seen <= bound && open.error_status <= bound,
        "with the breakers open the apps saw {app_seen} requests (the load got {} app errors), \
         more than the {probes} half-open probes allow ({bound}, with one straddling probe per pod)",
        open.error_status
    );
    ensure!(
        app_seen >= 1,
        "the breakers made {probes} half-open transitions but no probe reached an app"
    );
    ensure!(
        fallback_seen == (200, Some("breaker_open".into()), FALLBACK_BODY.into()),
        "the fallback answer: {fallback_seen:?}"
    );
    ensure!(
        outside_route.0 == 503 && !outside_route.1,
        "a path outside the breaker's route should reach the faulty app: {outside_route:?}"
    );
    ensure!(
        recovered.ok == recovered.done() && recovered.done() >= 100,
        "after the breakers closed some requests did not succeed: {recovered:?}"
    );
    Ok(())
}
