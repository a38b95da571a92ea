//! Argo Rollouts: a GraceRoute whose `targetRef` is a `Rollout` (`argoproj.io`) protects
//! a canary and a blue-green rollout as it protects a Deployment's.
//!
//! On the real cluster with the real Argo Rollouts controller (v1.10.1, built from the Go
//! module proxy by `e2e/argo/up`), under the same constant keep-alive load:
//! - `demo-with`: a Rollout annotated `kubegrace.io/inject=enabled` (the operator copies
//!   it into the Rollout's pod template; the webhook injects the pods Argo's ReplicaSets
//!   create) with a GraceRoute on it; `demo-without`: the same Rollout, plain.
//! - Each is rolled to a new pod template: the canary through one pod at a third of the
//!   weight, a pause, then the rest; the blue-green through a full preview set, promoted,
//!   the old set scaled away 5 s later.
//! - With kubegrace no request fails; without it some do (the baseline that shows the loss),
//!   for each strategy. The route reports the drains of the old pods (`status.lastDrains`,
//!   revision from Argo's `rollouts-pod-template-hash`) and injects every pod.
//! - `kubectl kubegrace status rollout/demo-with` lists the pods, and `kubectl kubegrace
//!   verify rollout/demo-with` rolls it once more under its own load and passes.
//!
//! In `make test` (the cluster tier) and `make argo-test`. In the cluster
//! tier it installs Argo Rollouts (`e2e/argo/up`) and fails, never skips, when that fails.

use std::time::Duration;

use anyhow::{Result, ensure};
use kubegrace_e2e::plugin_cli::run as plugin;
use kubegrace_e2e::scenario::{
    self, Action, ArgoStrategy, Options, Progress, RunResult, WITH, WITHOUT, Workload, kit,
    with_install,
};

/// What one strategy's runs measured.
struct Measured {
    strategy: ArgoStrategy,
    with: RunResult,
    without: RunResult,
    last_drains: serde_json::Value,
}

#[tokio::test]
async fn argo_rollouts_lose_no_request_with_kubegrace_and_some_without() -> Result<()> {
    let test = "argo_rollouts_lose_no_request_with_kubegrace_and_some_without";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    // Builds (once, cached) and runs the Argo Rollouts controller; fails saying why.
    scenario::argo::ensure_argo_rollouts().await?;
    let mut opts = Options::new("kg-argo").with_load_from_env()?;
    opts.drain = scenario::Drain::product_defaults();
    let p = Progress::default();
    let measured = with_install(&client, &opts, &p, scenario::keep_from_env(), async |run| {
        let mut measured = Vec::new();
        for strategy in [ArgoStrategy::Canary, ArgoStrategy::BlueGreen] {
            let what = match strategy {
                ArgoStrategy::Canary => "argo-canary",
                ArgoStrategy::BlueGreen => "argo-bluegreen",
            };
            let sc = run
                .scenario(what)
                .await?
                .with_workload(Workload::Rollout(strategy));
            sc.deploy(&p).await?;
            let with = sc.roll_under_load(WITH, Action::Restart, &p).await?;
            let replicas = i64::from(opts.replicas);
            let route = kit::wait_last_drains(&sc, WITH, replicas, &p).await?;
            let without = sc.roll_under_load(WITHOUT, Action::Restart, &p).await?;
            // What a user runs after a deploy: the plugin on the Rollout itself.
            let (status_code, status_out, status_err) = plugin(
                &["status", &format!("rollout/{WITH}"), "-n", &sc.namespace],
                Duration::from_secs(60),
            )
            .await?;
            p.step(format!("status rollout/{WITH} (exit {status_code}):\n{status_out}"));
            ensure!(
                status_code == 0 && status_out.matches(WITH).count() >= 3,
                "status rollout/{WITH}: exit {status_code}, expected a row per pod\n{status_out}{status_err}"
            );
            let (code, out, err) = plugin(
                &[
                    "verify",
                    &format!("rollout/{WITH}"),
                    "-n",
                    &sc.namespace,
                    "--rate",
                    "50",
                    "--duration",
                    "120s",
                    "--loadgen-image",
                    &opts.loadgen_image(),
                ],
                Duration::from_secs(200),
            )
            .await?;
            p.step(format!("verify rollout/{WITH} (exit {code}):\n{out}"));
            ensure!(
                code == 0,
                "verify rollout/{WITH}: exit {code}, expected 0 (no request failed)\n{out}{err}"
            );
            measured.push(Measured {
                strategy,
                with,
                without,
                last_drains: route.data["status"]["lastDrains"].clone(),
            });
        }
        Ok(measured)
    })
    .await?;

    for m in &measured {
        eprintln!(
            "measured: Argo Rollouts {:?}: with kubegrace {}; without {}; lastDrains {}",
            m.strategy,
            m.with.describe(),
            m.without.describe(),
            m.last_drains
        );
    }
    for m in &measured {
        ensure!(
            m.with.summary.failed == 0,
            "{:?} with kubegrace: {} of {} requests failed: {:?}",
            m.strategy,
            m.with.summary.failed,
            m.with.summary.requests,
            m.with.summary.by_detail
        );
        ensure!(
            m.without.summary.failed > 0,
            "{:?} without kubegrace: no request failed ({} sent): the baseline shows nothing, \
             so the comparison proves nothing",
            m.strategy,
            m.without.summary.requests
        );
        let d = &m.last_drains;
        ensure!(
            d["forceClosed"].as_i64() == Some(0)
                && d["revision"].as_str().is_some_and(|r| !r.is_empty()),
            "{:?}: the route's lastDrains should hold the old revision's clean drains: {d}",
            m.strategy
        );
    }
    Ok(())
}
