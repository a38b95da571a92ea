//! One run under load: the change ([`Action`]) applied mid-load and the wait until the
//! Deployment is rolled out and the old pods are gone.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kubegrace_sidecar_api::keys;
use serde_json::json;

use super::progress::unix_now;
use super::status::short;
use super::{Patience, Progress, RunResult, Scenario, pod_ready};

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

impl Scenario {
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

    pub(super) async fn act_and_wait(
        &self,
        name: &str,
        action: Action,
        before: &BTreeMap<String, bool>,
        p: &Progress,
    ) -> Result<Acted> {
        // The lead-in is part of the measurement (steady state before the change), not a
        // wait for something to happen.
        tokio::time::sleep(self.opts.load.lead_in).await;
        // The rollout counts only once the workload's generation moved past this: an
        // annotation changes no spec, so the generation moves when the operator acts.
        let generation_before = self.workload_generation(name).await?;
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
                crate::load::rollout::restart_patch(at)
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
        self.patch_workload(name, &patch).await?;

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
            Patience::new(budget, Duration::from_millis(250)),
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
                    let generation = self
                        .workload_generation(name)
                        .await
                        .map_err(|e| format!("{e:#}"))?;
                    if generation > generation_before
                        && self.workload_rolled_out(name).await.is_ok()
                    {
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
pub(super) struct Acted {
    pub(super) rollout_s: f64,
    pub(super) at_unix_s: f64,
    pub(super) events: Vec<(f64, String)>,
    pub(super) killed: Vec<String>,
}
