//! Healing: pods that ask for the sidecar but were admitted without it
//! (the webhook was unreachable and `failurePolicy: Ignore` let them in, or
//! they were created before their GraceRoute) are evicted, so their
//! controller recreates them and the webhook injects the new ones.
//!
//! Without this, a route stays `PodsNotInjected` until someone deletes the
//! pod by hand (issue #34). The rules, each a pure function below:
//! - only a pod the webhook would inject *now* ([`webhook::decide`] says
//!   `Inject`), so a pod the webhook skips on purpose is never churned;
//! - only pods a ReplicaSet or StatefulSet controls (a bare pod or a Job's
//!   pod would not come back, or would rerun its work);
//! - one pod at a time per workload, and only while every other pod of that
//!   workload is Ready and none is terminating;
//! - at most one eviction per round (`--heal-interval`) cluster-wide;
//! - through the Eviction API, so PodDisruptionBudgets hold (a 429 means:
//!   try again next round);
//! - only when a dry-run probe shows the webhook answering through its
//!   Service ([`crate::webhook_check`]); otherwise the replacement would be
//!   bare too;
//! - only pods the webhook configuration would send to the webhook (its
//!   namespace and object selectors, as the API server evaluates them): a
//!   pod in an excluded namespace would come back bare, evicted again, and
//!   so on; on a cluster with several installs, another install's pods are
//!   left to it;
//! - never for a route annotated `kubegrace.io/heal: disabled`.
//!
//! Each eviction gets an Event on the pod and on the route, and is counted.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{EvictParams, ListParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use crate::crd::GraceRoute;
use crate::webhook::{self, Decision, SidecarSettings};
use crate::webhook_check::{self, Verdict};
use crate::{Error, Result, keys};

/// Bounds of `--heal-interval`: the time between two rounds, and so the
/// cluster-wide eviction rate (one per round at most).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// What the operator's flags say about healing.
#[derive(Debug, Clone)]
pub struct HealSettings {
    pub interval: Duration,
    /// Where to dry-run the webhook probe before evicting; `None`: trust
    /// that the webhook serves.
    pub probe_namespace: Option<String>,
    /// The MutatingWebhookConfiguration whose selectors say which pods the
    /// webhook sees.
    pub webhook_config: String,
}

/// The probe-only entry of the chart: it serves no application pod.
pub const PROBE_ENTRY: &str = "check.inject.kubegrace.io";

/// Whether the API server sends a pod with these labels, in a namespace
/// with these labels, to one of `webhooks` (the probe entry aside). A
/// selector that does not parse selects nothing.
pub fn served(
    webhooks: &[MutatingWebhook],
    ns_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
) -> bool {
    let matches = |sel: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
                   labels: &BTreeMap<String, String>| {
        match sel {
            // The API server's default: everything.
            None => true,
            Some(ls) => Selector::try_from(ls.clone()).is_ok_and(|s| s.matches(labels)),
        }
    };
    webhooks.iter().filter(|w| w.name != PROBE_ENTRY).any(|w| {
        matches(w.namespace_selector.as_ref(), ns_labels)
            && matches(w.object_selector.as_ref(), pod_labels)
    })
}

/// Refuses an interval outside [`MIN_INTERVAL`]..=[`MAX_INTERVAL`].
pub fn checked_interval(d: Duration) -> Result<Duration> {
    crate::cli::duration_within("--heal-interval", d, MIN_INTERVAL, MAX_INTERVAL)
}

/// A bare pod that may be evicted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub pod: String,
    pub namespace: String,
    pub route: String,
    /// UID of the ReplicaSet or StatefulSet controlling it.
    pub owner: String,
}

/// The ReplicaSet or StatefulSet controlling the pod, if any.
pub fn workload_owner(pod: &Pod) -> Option<&OwnerReference> {
    pod.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && o.api_version == "apps/v1"
            && (o.kind == "ReplicaSet" || o.kind == "StatefulSet")
    })
}

/// Whether the route turned healing off (`kubegrace.io/heal: disabled`).
pub fn heal_disabled(route: &GraceRoute) -> bool {
    route
        .annotations()
        .get(keys::HEAL)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("disabled"))
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The bare pods of one namespace the webhook would inject now.
pub fn candidates(
    pods: &[Pod],
    ns_labels: &BTreeMap<String, String>,
    routes: &[GraceRoute],
    settings: &SidecarSettings,
    webhooks: &[MutatingWebhook],
) -> Vec<Candidate> {
    pods.iter()
        .filter(|p| !terminating(p) && !finished(p))
        .filter(|p| served(webhooks, ns_labels, p.labels()))
        .filter_map(|p| {
            let owner = workload_owner(p)?;
            // The token only fills the edited pod, which is dropped.
            match webhook::decide(p, ns_labels, routes, settings, String::new()) {
                Decision::Inject(..) => {}
                Decision::Ignore | Decision::Skip(..) => return None,
            }
            let route = crate::route_match::pick_route(p, routes)?;
            if heal_disabled(route) {
                return None;
            }
            Some(Candidate {
                pod: p.name_any(),
                namespace: p.namespace().unwrap_or_default(),
                route: route.name_any(),
                owner: owner.uid.clone(),
            })
        })
        .collect()
}

/// Whether every other pod of `owner` is Ready and none is terminating:
/// evicting one more then never leaves the workload with two pods down.
pub fn siblings_settled(pods: &[Pod], owner: &str, except: &str) -> bool {
    pods.iter()
        .filter(|p| workload_owner(p).is_some_and(|o| o.uid == owner))
        .filter(|p| p.name_any() != except)
        .all(|p| !terminating(p) && is_ready(p))
}

/// The first candidate whose workload can spare it now.
pub fn pick<'a>(cands: &'a [Candidate], pods: &[Pod]) -> Option<&'a Candidate> {
    cands
        .iter()
        .find(|c| siblings_settled(pods, &c.owner, &c.pod))
}

/// Eviction outcomes, the `result` label of
/// `kubegrace_operator_heal_evictions_total`.
pub const RESULTS: [&str; 4] = [
    "evicted",
    "disruption_budget",
    "webhook_unreachable",
    "error",
];

/// Counters of the healing loop.
#[derive(Debug, Default)]
pub struct HealMetrics {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl HealMetrics {
    pub fn count(&self, result: &'static str) {
        let mut m = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = m.entry(result).or_default();
        *n = n.saturating_add(1);
    }

    pub fn get(&self, result: &str) -> u64 {
        let m = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.get(result).copied().unwrap_or(0)
    }

    /// Prometheus text, every result present from the start.
    pub fn render(&self, out: &mut String) {
        kubegrace_sidecar_api::exposition::Family::new(
            out,
            "kubegrace_operator_heal_evictions_total",
            "counter",
            "Pods admitted without the sidecar that the operator tried to evict, by result.",
        )
        .by("result", RESULTS.map(|r| (r, self.get(r))));
    }
}

/// Everything a round needs.
pub struct Healer {
    pub client: Client,
    pub sidecar: SidecarSettings,
    pub settings: HealSettings,
    pub namespaces: Vec<Option<String>>,
    pub metrics: std::sync::Arc<HealMetrics>,
    pub recorder: Recorder,
}

impl Healer {
    pub fn new(
        client: Client,
        sidecar: SidecarSettings,
        settings: HealSettings,
        namespaces: Vec<Option<String>>,
        metrics: std::sync::Arc<HealMetrics>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "kubegrace-operator-heal".into(),
                instance: None,
            },
        );
        Self {
            client,
            sidecar,
            settings,
            namespaces,
            metrics,
            recorder,
        }
    }

    /// Rounds every `interval` until `stop` is set.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        tracing::info!(interval = ?self.settings.interval, probe = ?self.settings.probe_namespace, "healing pods admitted without the sidecar");
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.settings.interval) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "heal round failed; next round retries");
            }
        }
    }

    /// One round: finds one pod to evict, and evicts it.
    pub async fn round(&self) -> Result<()> {
        let Some((cand, route, pod)) = self.find().await? else {
            return Ok(());
        };
        if let Some(ns) = &self.settings.probe_namespace {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match webhook_check::probe(&api, &webhook_check::probe_pod(ns)).await {
                Ok(Verdict::Answered) => {}
                other => {
                    tracing::info!(pod = %cand.pod, namespace = %cand.namespace, probe = ?other, "bare pod waits: the webhook does not answer through its Service yet");
                    self.metrics.count("webhook_unreachable");
                    return Ok(());
                }
            }
        }
        self.evict(&cand, &route, &pod).await;
        Ok(())
    }

    async fn find(&self) -> Result<Option<(Candidate, GraceRoute, Pod)>> {
        let webhooks = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .get(&self.settings.webhook_config)
            .await
            .map_err(Error::kube(format!(
                "heal: reading MutatingWebhookConfiguration {}",
                self.settings.webhook_config
            )))?
            .webhooks
            .unwrap_or_default();
        for scope in &self.namespaces {
            let routes = crate::scope::api::<GraceRoute>(&self.client, scope.as_deref())
                .list(&ListParams::default())
                .await
                .map_err(Error::kube("heal: listing GraceRoutes"))?
                .items;
            let mut by_ns: BTreeMap<String, Vec<GraceRoute>> = BTreeMap::new();
            for r in routes {
                by_ns
                    .entry(r.namespace().unwrap_or_default())
                    .or_default()
                    .push(r);
            }
            for (ns, routes) in by_ns {
                if routes.iter().all(heal_disabled) {
                    continue;
                }
                let mut labels = Api::<Namespace>::all(self.client.clone())
                    .get_opt(&ns)
                    .await
                    .map_err(Error::kube(format!("heal: reading namespace {ns}")))?
                    .map(|n| n.labels().clone())
                    .unwrap_or_default();
                // Set by the API server on every namespace; the chart's selectors use it.
                labels
                    .entry("kubernetes.io/metadata.name".into())
                    .or_insert_with(|| ns.clone());
                let pods = Api::<Pod>::namespaced(self.client.clone(), &ns)
                    .list(&ListParams::default())
                    .await
                    .map_err(Error::kube(format!("heal: listing pods in {ns}")))?
                    .items;
                let cands = candidates(&pods, &labels, &routes, &self.sidecar, &webhooks);
                if let Some(c) = pick(&cands, &pods) {
                    let route = routes.iter().find(|r| r.name_any() == c.route);
                    let pod = pods.iter().find(|p| p.name_any() == c.pod);
                    if let (Some(route), Some(pod)) = (route, pod) {
                        return Ok(Some((c.clone(), route.clone(), pod.clone())));
                    }
                } else if !cands.is_empty() {
                    tracing::debug!(namespace = %ns, waiting = cands.len(), "bare pods wait for their workload's other pods to be Ready");
                }
            }
        }
        Ok(None)
    }

    async fn evict(&self, c: &Candidate, route: &GraceRoute, pod: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &c.namespace);
        match api.evict(&c.pod, &EvictParams::default()).await {
            Ok(_) => {
                tracing::info!(pod = %c.pod, namespace = %c.namespace, route = %c.route, "evicted a pod admitted without the sidecar");
                self.metrics.count("evicted");
                let note = format!(
                    "pod {} asked for the sidecar but was admitted without it (webhook unreachable or no route yet); evicted so its controller recreates it with the sidecar (turn off: annotate the GraceRoute {}=disabled)",
                    c.pod,
                    keys::HEAL
                );
                let pod_ref = pod.object_ref(&());
                self.publish(&pod_ref, None, note.clone()).await;
                // The pod as the related object: one Event per pod on the route,
                // where without it the recorder folds them into one series that
                // names only the last pod.
                self.publish(&route.object_ref(&()), Some(pod_ref), note)
                    .await;
            }
            Err(kube::Error::Api(e)) if e.code == 429 => {
                tracing::info!(pod = %c.pod, namespace = %c.namespace, "eviction refused by a PodDisruptionBudget; next round retries");
                self.metrics.count("disruption_budget");
            }
            Err(e) => {
                tracing::warn!(pod = %c.pod, namespace = %c.namespace, error = %e, "evicting a pod admitted without the sidecar");
                self.metrics.count("error");
            }
        }
    }

    async fn publish(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        related: Option<k8s_openapi::api::core::v1::ObjectReference>,
        note: String,
    ) {
        let event = Event {
            type_: EventType::Normal,
            reason: "EvictedWithoutSidecar".into(),
            note: Some(note),
            action: "Heal".into(),
            secondary: related,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            // Events are for people; a failed one must not stop healing.
            tracing::debug!(error = %e, "publishing event");
        }
    }
}

#[cfg(test)]
mod tests;
