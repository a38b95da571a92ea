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
//!
//! One file a job: `options` (what a run is told), `progress` (steps and waits), `install`
//! (the chart's helm install and uninstall around a run), `manifests` (the objects a run
//! creates), `status` (reading their state), `deploy` ([`Scenario`]: deploy and settle the
//! demo app), `load_job` (the load, from this host or a loadgen Job), `rollout` (the change
//! under load and the wait for it), `results` (what a run measured), `kit` (clients for the
//! demo app's long exchanges and the cluster helpers the in-flight and breaker tests share),
//! `balancer` (HAProxy and CoreDNS on this host in front of the demo app, `tests/balancer.rs`),
//! `placement` (the loadgen and the app's pods on different nodes when the cluster has several).

pub mod argo;
pub mod balancer;
mod deploy;
mod install;
pub mod kit;
mod load_job;
mod manifests;
mod options;
mod placement;
mod progress;
pub mod restart;
mod results;
mod rollout;
mod status;
mod workload;

use anyhow::Result;
use kube::Client;

pub use deploy::Scenario;
pub use install::{Install, Installed, helm_bin, keep_from_env, with_install};
pub use load_job::{LOADGEN_CONTROL_PORT, RunningLoad};
pub use manifests::{
    APP_PORT, RUN_LABEL, WITH, WITHOUT, demo_container, deployment, graceroute, graceroute_api,
    service,
};
pub use options::{Drain, LoadMode, LoadOptions, Options, suffix};
pub use placement::Placement;
pub use progress::{Patience, Progress};
pub use results::{Outcome, RunResult};
pub use rollout::Action;
pub use status::{all_containers, events_for, has_sidecar, pod_ready, route_condition};
pub use workload::{ArgoStrategy, SCALE_DOWN_DELAY_S, Workload, argo_rollout};

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
    with_install(client, opts, p, keep, async |run| {
        let sc = run.scenario("rollout").await?;
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
    })
    .await
}
