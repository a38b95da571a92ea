//! What the operator's `rollout.pauseOnDrainLoss` writes and reads, shared
//! with `kubectl kubegrace resume`: the `RolloutPaused` condition and its
//! reasons, the resume annotation, the pause's field manager, and a
//! workload's rollout state read from its object (pure). The decision and
//! the writes are the operator's (`controller::pause`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::core::SelectorExt;
use kube::core::params::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::argo::Rollout;
use crate::crd::TargetKind;
use crate::workloads::selector_of;

/// The route condition type.
pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
/// `RolloutPaused=True`: the operator paused a Deployment for a lossy drain.
pub const DRAIN_LOSS: &str = "DrainLoss";
/// `RolloutPaused=False`: the Deployment was resumed after such a pause.
pub const RESUMED: &str = "Resumed";
/// `RolloutPaused=False`: a StatefulSet's drain lost requests; it has no
/// `spec.paused` to set (and its `partition` belongs to the user's
/// manifest), so the rollout goes on and only this condition and an Event
/// say so.
pub const CANNOT_PAUSE: &str = "CannotPause";
/// Route annotation: when the rollout was resumed (RFC 3339), written by
/// `kubectl kubegrace resume`. Drains that ended before it never pause.
pub const RESUMED_AT: &str = "kubegrace.io/resumed-at";
/// Field manager of the `spec.paused` writes (pause and resume).
pub const PAUSE_FIELD_MANAGER: &str = "kubegrace-operator-pause";

/// Writes as [`PAUSE_FIELD_MANAGER`]: the operator's pause, the plugin's
/// resume and its `RESUMED_AT` annotation.
pub fn pause_params() -> PatchParams {
    PatchParams {
        field_manager: Some(PAUSE_FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// The merge patch of a Deployment's `spec.paused`, written with
/// [`pause_params`]: a merge patch, not the route's server-side apply,
/// which would drop the field on the next pass that does not send it.
pub fn paused_patch(paused: bool) -> Patch<Value> {
    Patch::Merge(json!({"spec": {"paused": paused}}))
}

/// A target's rollout as the decision needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutState {
    pub kind: TargetKind,
    pub name: String,
    /// The workload's pod selector (immutable, so it also selects the pods
    /// of older revisions, whose template labels may differ).
    pub selector: LabelSelector,
    /// `spec.paused` (Deployments and Rollouts; always false for a
    /// StatefulSet).
    pub paused: bool,
    /// ... and [`PAUSE_FIELD_MANAGER`] wrote it: this operator paused it
    /// (a pause whose status write failed is taken up again on the retry).
    pub paused_here: bool,
    /// A rollout is under way: pods of an older revision remain or the
    /// controller has not seen the latest spec.
    pub progressing: bool,
}

impl RolloutState {
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Whether the workload's selector selects pods with these labels (an
    /// empty selector selects none here: it would select every pod).
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        selector_of(&self.selector).is_some_and(|s| !s.selects_all() && s.matches(labels))
    }
}

/// A Deployment's rollout state; None without a spec.
pub fn deployment_state(d: &Deployment) -> Option<RolloutState> {
    let spec = d.spec.as_ref()?;
    let status = d.status.clone().unwrap_or_default();
    let seen = status.observed_generation >= d.metadata.generation;
    let updated = status.updated_replicas.unwrap_or(0);
    let progressing =
        !seen || updated < spec.replicas.unwrap_or(1) || status.replicas.unwrap_or(0) > updated;
    Some(RolloutState {
        kind: TargetKind::Deployment,
        name: d.name_any(),
        selector: spec.selector.clone(),
        paused: spec.paused.unwrap_or(false),
        paused_here: paused_by_manager(d),
        progressing,
    })
}

/// Whether [`PAUSE_FIELD_MANAGER`] owns the workload's `spec.paused`.
fn paused_by_manager(d: &impl ResourceExt) -> bool {
    d.managed_fields().iter().any(|m| {
        m.manager.as_deref() == Some(PAUSE_FIELD_MANAGER)
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:paused").is_some())
    })
}

/// A StatefulSet's rollout state; None without a spec.
pub fn statefulset_state(s: &StatefulSet) -> Option<RolloutState> {
    let spec = s.spec.as_ref()?;
    let status = s.status.clone().unwrap_or_default();
    let seen = status.observed_generation >= s.metadata.generation;
    let progressing = !seen
        || status.update_revision.is_some() && status.update_revision != status.current_revision
        || status.updated_replicas.unwrap_or(0) < spec.replicas.unwrap_or(1);
    Some(RolloutState {
        kind: TargetKind::StatefulSet,
        name: s.name_any(),
        selector: spec.selector.clone(),
        paused: false,
        paused_here: false,
        progressing,
    })
}

/// An Argo Rollout's rollout state; None without a selector. Argo's
/// `spec.paused` is the user-level pause, the one this operator sets.
pub fn rollout_state(r: &Rollout) -> Option<RolloutState> {
    let spec = &r.spec;
    let selector = spec.selector.clone()?;
    let updated = r.status_count("updatedReplicas");
    // A canary or blue-green revision not yet promoted is a rollout under
    // way even when every replica is updated (blue-green's preview set).
    let unpromoted = r.status_str("currentPodHash").is_some() && !r.promoted();
    let progressing = !r.seen()
        || unpromoted
        || updated < spec.replicas.unwrap_or(1)
        || r.status_count("replicas") > updated;
    Some(RolloutState {
        kind: TargetKind::Rollout,
        name: r.name_any(),
        selector,
        paused: spec.paused,
        paused_here: paused_by_manager(r),
        progressing,
    })
}

/// The rollout states of the workloads, by [`RolloutState::id`].
pub fn states(
    deployments: &[Deployment],
    statefulsets: &[StatefulSet],
    rollouts: &[Rollout],
) -> BTreeMap<String, RolloutState> {
    deployments
        .iter()
        .filter_map(deployment_state)
        .chain(statefulsets.iter().filter_map(statefulset_state))
        .chain(rollouts.iter().filter_map(rollout_state))
        .map(|s| (s.id(), s))
        .collect()
}
