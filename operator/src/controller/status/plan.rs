//! The rest of the status step before the write (pure): the drain reports
//! the pod watch collected, folded into `status.lastDrains`; the Events of
//! the drains that cut something; the `rollout.pauseOnDrainLoss` decision
//! and its `RolloutPaused` condition; the transition times of unchanged
//! conditions kept; and whether the status differs from what is stored.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;

use super::super::context::{Note, Subject};
use super::super::decisions;
use super::super::dereference::Observed;
use super::super::drains::{self, Folded, PodDrain};
use super::super::pause::{self, Verdict};
use super::Report;
use super::conditions::{carry_transitions, same_status};
use crate::crd::TargetKind;
use crate::crd::{GraceRoute, GraceRouteStatus, LastDrains};
use crate::reasons::{DRAIN_FORCE_CLOSED, ROLLOUT_PAUSED};

/// Everything the status write does, decided.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The status to store, transition times carried over.
    pub status: GraceRouteStatus,
    /// It differs from the stored one (timestamps aside): write it.
    pub changed: bool,
    /// The Events, on the route and on its workloads.
    pub events: Vec<Note>,
    /// The workload (Deployment or Rollout) to pause before the status
    /// says so.
    pub pause: Option<(TargetKind, String)>,
    /// The drains counted now, and the totals that hold them.
    pub drains: Folded,
    /// The decisions, one line each, for the info log.
    pub decisions: Vec<String>,
}

/// Plans the write of `report` (pure). `written` are the totals this
/// process stored last (newer than what the cached route may show),
/// `taken` the drain reports that came in since.
pub fn plan(
    route: &GraceRoute,
    observed: &Observed,
    report: Report,
    written: Option<LastDrains>,
    taken: Vec<PodDrain>,
    now: Time,
) -> Plan {
    let Report {
        mut status,
        mut events,
    } = report;
    let base = written.or(status.last_drains.take());
    let folded = drains::fold(base.as_ref(), taken, now.clone());
    status.last_drains = folded.last.clone();
    for drain in folded.new.iter().filter(|d| !d.clean()) {
        events.push(Note::on_route(
            EventType::Warning,
            DRAIN_FORCE_CLOSED,
            "Drain",
            drain.note(),
        ));
        events.extend(on_workloads(route, observed, drain));
    }
    let enabled = pause::enabled(route);
    let verdict = pause::decide(
        enabled,
        &folded.new,
        &observed.rollouts,
        pause::since(route),
    );
    status.conditions.extend(pause::condition(
        route.condition(ROLLOUT_PAUSED),
        verdict.as_ref(),
        &observed.rollouts,
        enabled,
        route.metadata.generation,
        now,
    ));
    let name = route.metadata.name.as_deref().unwrap_or_default();
    if let Some(v) = &verdict {
        events.extend(pause::notes(name, v));
    }
    let pause = match verdict {
        Some(Verdict::Pause(loss)) => Some((loss.kind, loss.name)),
        _ => None,
    };
    carry_transitions(route.status.as_ref(), &mut status);
    let changed = route
        .status
        .as_ref()
        .is_none_or(|old| !same_status(old, &status));
    Plan {
        decisions: decisions::changes(route.status.as_ref(), &status),
        status,
        changed,
        events,
        pause,
        drains: folded,
    }
}

/// A force-closed drain's Event on the workloads the pod belonged to
/// (their pod template's labels are on the pod), where `kubectl describe
/// deploy` shows it.
fn on_workloads(route: &GraceRoute, observed: &Observed, drain: &PodDrain) -> Vec<Note> {
    let name = route.metadata.name.as_deref().unwrap_or_default();
    observed
        .targets
        .iter()
        .filter(|(target, _)| {
            let template = target
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.as_ref());
            template.is_some_and(|l| l.iter().all(|(k, v)| drain.labels.get(k) == Some(v)))
        })
        .map(|(target, _)| Note {
            on: Subject::Workload {
                kind: target.kind,
                name: target.name.clone(),
            },
            ..Note::on_route(
                EventType::Warning,
                DRAIN_FORCE_CLOSED,
                "Drain",
                format!("GraceRoute {name}: {}", drain.note()),
            )
        })
        .collect()
}
