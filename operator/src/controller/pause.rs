//! `rollout.pauseOnDrainLoss`: a rollout whose drains lose requests stops
//! itself. The drain reports the route already collects ([`super::drains`])
//! are the evidence; the decision is pure ([`decide`], [`condition`]), and
//! only [`set_paused`] writes (the Deployment's `spec.paused`).
//!
//! What counts as loss is what the drain report calls not clean: at least
//! one connection still open at `drain.timeout` and closed by force (with
//! the requests in flight on it cut, if any). That is the same line the
//! `DrainForceClosed` Event and `status.lastDrains.forceClosed` draw; a
//! force-closed connection with no request counted in flight is still a
//! cut WebSocket, gRPC stream or raw TCP session, so it counts too.
//!
//! A loss pauses only while the workload is rolling (a scale-down or the
//! last pod of a finished rollout has nothing left to stop), only a
//! Deployment nobody paused already, and only for a drain that ended after
//! the last pause or resume: the route's `RolloutPaused` condition's
//! transition time, or the time `kubectl kubegrace resume` wrote into the
//! route's [`RESUMED_AT`] annotation, whichever is later. So a resumed
//! rollout is not paused again by a report of a pod that drained before.
//!
//! The pause is a merge patch by its own field manager
//! ([`PAUSE_FIELD_MANAGER`]), not part of the route's server-side apply:
//! that apply is recomputed every pass and would drop a field it no longer
//! sends. A GitOps tool re-applying a manifest that does not mention
//! `spec.paused` (Helm's three-way merge, Argo CD's apply, client- or
//! server-side) leaves it alone; a manifest that sets `paused: false`
//! resumes the rollout on its next sync, which the condition then records
//! as `Resumed`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::DynamicObject;
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};

use super::context::{Note, Subject};
use super::drains::PodDrain;
use crate::crd::{GraceRoute, TargetKind};

pub use kubegrace_api::pause::{
    CANNOT_PAUSE, DRAIN_LOSS, PAUSE_FIELD_MANAGER, RESUMED, RESUMED_AT, ROLLOUT_PAUSED,
    RolloutState, deployment_state, pause_params, paused_patch, statefulset_state, states,
};

/// What the lossy drain asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Pause this Deployment.
    Pause(Loss),
    /// A StatefulSet lost requests: report it, nothing to pause.
    CannotPause(Loss),
}

impl Verdict {
    pub fn loss(&self) -> &Loss {
        match self {
            Verdict::Pause(l) | Verdict::CannotPause(l) => l,
        }
    }
}

/// A lossy drain of a pod of a rolling target.
#[derive(Debug, Clone, PartialEq)]
pub struct Loss {
    pub kind: TargetKind,
    pub name: String,
    pub drain: PodDrain,
}

impl Loss {
    /// The workload, as [`RolloutState::id`].
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Which pod lost what, why, and what to do.
    pub fn message(&self, paused: bool) -> String {
        let o = &self.drain.outcome;
        let what = format!(
            "pod {} force-closed {} connections and cut {} requests at drain.timeout ({} in flight at the {} trigger)",
            self.drain.pod, o.force_closed, o.requests_cut, o.inflight_at_trigger, o.trigger
        );
        if paused {
            format!(
                "{}/{} paused: {what}; raise drain.timeout above the app's longest request, then `kubectl kubegrace resume` the route (or `kubectl rollout resume`)",
                self.kind, self.name
            )
        } else {
            format!(
                "{}/{} not paused (a StatefulSet has no spec.paused; its rollout goes on): {what}; raise drain.timeout above the app's longest request",
                self.kind, self.name
            )
        }
    }
}

/// The route's `rollout.pauseOnDrainLoss`.
pub fn enabled(route: &GraceRoute) -> bool {
    route
        .spec
        .rollout
        .as_ref()
        .is_some_and(|r| r.pause_on_drain_loss)
}

/// Drains that ended at or before this time never pause: the later of the
/// `RolloutPaused` condition's last transition and the [`RESUMED_AT`]
/// annotation (one that does not parse is ignored).
pub fn since(route: &GraceRoute) -> Option<jiff::Timestamp> {
    let transition = route
        .condition(ROLLOUT_PAUSED)
        .map(|c| c.last_transition_time.0);
    let resumed = route
        .annotations()
        .get(RESUMED_AT)
        .and_then(|v| v.parse::<jiff::Timestamp>().ok());
    transition.max(resumed)
}

/// The first new lossy drain (pure) that should pause its target, given
/// the option, the targets' rollouts and [`since`]. A drain without an end
/// time (a kubelet that did not record one) counts as new: `drains` are
/// the reports counted this pass, each pod once.
pub fn decide(
    enabled: bool,
    drains: &[PodDrain],
    rollouts: &[RolloutState],
    since: Option<jiff::Timestamp>,
) -> Option<Verdict> {
    if !enabled {
        return None;
    }
    let after = |d: &PodDrain| match (&d.finished_at, since) {
        (Some(end), Some(since)) => end.0 > since,
        _ => true,
    };
    for drain in drains.iter().filter(|d| !d.clean() && after(d)) {
        for r in rollouts
            .iter()
            .filter(|r| r.progressing && r.selects(&drain.labels))
        {
            let loss = Loss {
                kind: r.kind,
                name: r.name.clone(),
                drain: drain.clone(),
            };
            match r.kind {
                // Paused already by someone else: not ours to claim. Paused
                // here and the drain is new: a retry of a pause whose
                // status write failed (the patch is idempotent).
                TargetKind::Deployment | TargetKind::Rollout if r.paused && !r.paused_here => {}
                TargetKind::Deployment | TargetKind::Rollout => return Some(Verdict::Pause(loss)),
                TargetKind::StatefulSet => return Some(Verdict::CannotPause(loss)),
            }
        }
    }
    None
}

/// The `RolloutPaused` condition for this pass (pure): set by a verdict;
/// else a pause holds while a Deployment target is still paused and turns
/// `Resumed` when none is; a `False` one stays while the option is on.
/// None: the route shows no such condition.
pub fn condition(
    prev: Option<&Condition>,
    verdict: Option<&Verdict>,
    rollouts: &[RolloutState],
    enabled: bool,
    generation: Option<i64>,
    now: Time,
) -> Option<Condition> {
    let make = |ok: bool, reason: &str, message: String| Condition {
        type_: ROLLOUT_PAUSED.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    };
    match verdict {
        Some(Verdict::Pause(l)) => return Some(make(true, DRAIN_LOSS, l.message(true))),
        Some(Verdict::CannotPause(l)) => {
            return Some(make(false, CANNOT_PAUSE, l.message(false)));
        }
        None => {}
    }
    let prev = prev?;
    if prev.status == "True" {
        let still = rollouts
            .iter()
            .any(|r| r.kind != TargetKind::StatefulSet && r.paused);
        if still {
            return Some(prev.clone());
        }
        return Some(make(
            false,
            RESUMED,
            format!(
                "resumed after: {}; only drains that end from now on can pause it again",
                prev.message
            ),
        ));
    }
    enabled.then(|| prev.clone())
}

/// Sets a Deployment's or Argo Rollout's `spec.paused` as
/// [`PAUSE_FIELD_MANAGER`] (the plugin's resume too). A StatefulSet has no
/// such field: asking for one is an error of the API server's.
pub async fn set_paused(
    client: &Client,
    ns: &str,
    kind: TargetKind,
    name: &str,
    paused: bool,
) -> std::result::Result<(), kube::Error> {
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &kind.api_resource())
        .patch(name, &pause_params(), &paused_patch(paused))
        .await
        .map(drop)
}

/// The Warning Events of a verdict (pure): on the route with the workload
/// as the related object, and on the workload, where `kubectl describe`
/// shows it.
pub fn notes(route: &str, verdict: &Verdict) -> [Note; 2] {
    let loss = verdict.loss();
    let (reason, note) = match verdict {
        Verdict::Pause(l) => (ROLLOUT_PAUSED, l.message(true)),
        Verdict::CannotPause(l) => (CANNOT_PAUSE, l.message(false)),
    };
    let workload = Subject::Workload {
        kind: loss.kind,
        name: loss.name.clone(),
    };
    let on_route = Note {
        related: Some(workload.clone()),
        ..Note::on_route(EventType::Warning, reason, "Pause", note.clone())
    };
    let on_workload = Note {
        on: workload,
        ..Note::on_route(
            EventType::Warning,
            reason,
            "Pause",
            format!("GraceRoute {route}: {note}"),
        )
    };
    [on_route, on_workload]
}

#[cfg(test)]
#[path = "pause_tests.rs"]
mod tests;
