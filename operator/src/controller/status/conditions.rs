//! The route's conditions and the Events that announce them (pure): one
//! function per condition, each from what the earlier steps found. Events
//! go out on changes only (compared with the status the route had), so a
//! resync publishes nothing.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::super::build::Desired;
use super::super::dereference::Observed;
use super::super::validate::{Valid, service_bypasses};
use super::pods::{
    PodCount, count_pods, inject_hint, outdated_pods, rolling_out_message, short_grace,
};
use super::{Note, Report};
use crate::crd::{GraceRoute, GraceRouteStatus};
use crate::reasons::{
    ACCEPTED, AS_EXPECTED, BUDGET_APPLIED, CONFIG_APPLIED, DEGRADED, FRONTED,
    INJECTION_NOT_ENABLED, NETWORK_POLICY_BLOCKS_SIDECAR, NO_TARGETS, NOT_APPLIED, OVERLAP,
    PODS_NOT_INJECTED, READY, ROLLING_OUT, SERVICE_BYPASSES_SIDECAR, TARGET_NOT_FOUND, VALID,
};
use crate::rules::{self, Invalid};

/// One condition's verdict, before it gets its type and generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub ok: bool,
    pub reason: &'static str,
    pub message: String,
}

impl State {
    fn new(ok: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            ok,
            reason,
            message: message.into(),
        }
    }

    fn condition(&self, type_: &str, generation: Option<i64>) -> Condition {
        condition(type_, self.ok, self.reason, &self.message, generation)
    }
}

/// A route that did not validate: `Accepted=False` with the reason.
pub fn rejected(route: &GraceRoute, observed: &Observed, invalid: &Invalid) -> Report {
    let generation = route.metadata.generation;
    let old = route.status.clone().unwrap_or_default();
    let target_ids = observed.target_ids();
    let status = GraceRouteStatus {
        observed_generation: generation,
        conditions: vec![
            condition(
                ACCEPTED,
                false,
                invalid.reason,
                &invalid.message,
                generation,
            ),
            condition(
                READY,
                false,
                invalid.reason,
                "the route is not applied; see the Accepted condition",
                generation,
            ),
            condition(DEGRADED, false, NOT_APPLIED, "", generation),
        ],
        target_count: i32::try_from(target_ids.len()).unwrap_or(i32::MAX),
        targets: target_ids,
        ..old
    };
    let mut events = Vec::new();
    if route
        .condition(ACCEPTED)
        .is_none_or(|c| c.message != invalid.message)
    {
        events.push(Note::on_route(
            EventType::Warning,
            invalid.reason,
            "Validate",
            invalid.message.clone(),
        ));
    }
    Report { status, events }
}

/// A route that was applied: Accepted with the budget, Ready from the pods,
/// Degraded from overlaps, bare pods, bypassing Services and blocking
/// NetworkPolicies.
pub fn accepted(
    route: &GraceRoute,
    observed: &Observed,
    valid: &Valid,
    desired: &Desired,
) -> Report {
    let generation = route.metadata.generation;
    let count = count_pods(observed.pods.values(), &observed.ns_labels);
    let ready = ready(route, observed, &count, &desired.hash);
    let degraded = degraded(route, observed, &count, &ready);
    let target_ids = observed.target_ids();
    let budget = &valid.budget;
    let config_map = rules::config_map_name(&route.name_any());
    let old = route.status.clone().unwrap_or_default();
    let status = GraceRouteStatus {
        observed_generation: generation,
        conditions: vec![
            condition(
                ACCEPTED,
                true,
                VALID,
                accepted_message(observed, valid, desired),
                generation,
            ),
            ready.condition(READY, generation),
            degraded.condition(DEGRADED, generation),
        ],
        targets: target_ids.clone(),
        target_count: i32::try_from(target_ids.len()).unwrap_or(i32::MAX),
        pods_injected: count.injected,
        pods_expected: count.expected,
        injected: Some(format!("{}/{}", count.injected, count.expected)),
        budget_seconds: Some(budget.seconds),
        budget: Some(format!("{}s", budget.seconds)),
        config_map: Some(config_map),
        config_hash: Some(desired.hash.clone()),
        // Folded in by the status write from the drain reports collected.
        last_drains: old.last_drains.clone(),
    };
    let found = Found {
        count,
        ready,
        degraded,
    };
    let events = announcements(route, &old, &status, valid, observed, &found);
    Report { status, events }
}

/// The Accepted message: the budget and how it was derived, and what the
/// build step left alone.
fn accepted_message(observed: &Observed, valid: &Valid, desired: &Desired) -> String {
    let budget = &valid.budget;
    let mut msg = format!("time budget {}s: {}", budget.seconds, budget.explain());
    if budget.seconds != budget.required_seconds {
        msg.push_str(&format!(
            " (terminationGracePeriodSeconds pinned to {})",
            budget.seconds
        ));
    }
    if let Some((r, t)) = &budget.longest_route {
        msg.push_str(&format!(
            "; drain.timeout raised to {} for route {r:?}",
            kubegrace_sidecar_api::config::HumanDuration(*t)
        ));
    }
    for n in &desired.notes {
        msg.push_str("; ");
        msg.push_str(n);
    }
    let short = short_grace(observed.pods.values(), budget.seconds);
    if short > 0 {
        msg.push_str(&format!(
            "; {short} running pods have a shorter terminationGracePeriodSeconds (set when they were created); they get {}s when they are next replaced",
            budget.seconds
        ));
    }
    msg
}

/// Ready: every running pod of the targets carries the sidecar with the
/// config in force; otherwise the first thing in the way, with its fix.
pub fn ready(route: &GraceRoute, observed: &Observed, count: &PodCount, hash: &str) -> State {
    let ns = route.namespace().unwrap_or_default();
    let targets = &observed.targets;
    if targets.is_empty()
        && let Some(t) = &route.spec.target_ref
    {
        if !observed.overlaps.is_empty() {
            return State::new(false, OVERLAP, observed.overlaps.join("; "));
        }
        return State::new(
            false,
            TARGET_NOT_FOUND,
            format!(
                "{}/{} does not exist in namespace {ns}; create it or fix spec.targetRef",
                t.kind, t.name
            ),
        );
    }
    if targets.is_empty() && count.expected == 0 && count.injected == 0 {
        return State::new(
            false,
            NO_TARGETS,
            "no Deployment, StatefulSet or pod matches spec.selector",
        );
    }
    if let Some((pod, why)) = count.missing.first() {
        let why = why
            .as_deref()
            .unwrap_or("the webhook never saw it (down, or failurePolicy Ignore)");
        return State::new(
            false,
            PODS_NOT_INJECTED,
            format!(
                "{} of {} pods lack the sidecar, e.g. {pod}: {why}; fix the cause, then delete those pods or roll the workload",
                count.missing.len(),
                count.expected
            ),
        );
    }
    let outdated = outdated_pods(observed);
    if let Some(first) = outdated.first() {
        return State::new(
            false,
            ROLLING_OUT,
            rolling_out_message(first, outdated.len(), count.injected),
        );
    }
    if count.expected == 0 {
        return State::new(
            false,
            INJECTION_NOT_ENABLED,
            inject_hint(targets.first().map(|t| &t.0), &ns),
        );
    }
    State::new(
        true,
        FRONTED,
        format!(
            "{}/{} pods carry the sidecar with config {hash}",
            count.injected, count.expected
        ),
    )
}

/// Degraded: something keeps the sidecar from fronting traffic it should
/// (an overlap, bare pods, a Service or NetworkPolicy around it).
pub fn degraded(route: &GraceRoute, observed: &Observed, count: &PodCount, ready: &State) -> State {
    if !observed.overlaps.is_empty() {
        return State::new(
            true,
            OVERLAP,
            format!(
                "{}; delete one route or narrow its selector",
                observed.overlaps.join("; ")
            ),
        );
    }
    if !count.missing.is_empty() {
        return State::new(true, PODS_NOT_INJECTED, ready.message.clone());
    }
    let pod_labels: Vec<BTreeMap<String, String>> =
        observed.pods.values().map(|p| p.labels().clone()).collect();
    let bypasses = service_bypasses(
        route,
        &observed.target_refs(),
        &pod_labels,
        &observed.services,
    );
    if !bypasses.is_empty() {
        return State::new(true, SERVICE_BYPASSES_SIDECAR, bypasses.join("; "));
    }
    let blocked: Vec<String> =
        crate::netpol::blocked(observed.pods.values(), &observed.network_policies)
            .iter()
            .map(|b| {
                let (what, fix) = b.explain();
                format!("{what}; fix: {fix}")
            })
            .collect();
    if !blocked.is_empty() {
        return State::new(true, NETWORK_POLICY_BLOCKS_SIDECAR, blocked.join("; "));
    }
    State::new(false, AS_EXPECTED, "")
}

/// What the pods and the conditions came to, for the Events.
struct Found {
    count: PodCount,
    ready: State,
    degraded: State,
}

/// The Events of an applied route, each on a change from `old` only.
fn announcements(
    route: &GraceRoute,
    old: &GraceRouteStatus,
    new: &GraceRouteStatus,
    valid: &Valid,
    observed: &Observed,
    found: &Found,
) -> Vec<Note> {
    let Found {
        count,
        ready,
        degraded,
    } = found;
    let budget = &valid.budget;
    let mut events = Vec::new();
    if old.budget_seconds != Some(budget.seconds) && !new.targets.is_empty() {
        events.push(Note::on_route(EventType::Normal,
            BUDGET_APPLIED,
            "Apply",
            format!(
                "terminationGracePeriodSeconds {} for new pods of {} ({}), set by the webhook at pod creation; the workload is not edited",
                budget.seconds,
                new.targets.join(", "),
                budget.explain()
            ),
        ));
    }
    if old.config_hash != new.config_hash
        && let (Some(hash), Some(cm)) = (&new.config_hash, &new.config_map)
    {
        events.push(Note::on_route(
            EventType::Normal,
            CONFIG_APPLIED,
            "Apply",
            format!("sidecar config {hash} written to ConfigMap {cm}; running sidecars reload it"),
        ));
    }
    let was_missing = route
        .condition(READY)
        .is_some_and(|c| c.reason == PODS_NOT_INJECTED && c.message == ready.message);
    if !count.missing.is_empty() && !was_missing {
        events.push(Note::on_route(
            EventType::Warning,
            PODS_NOT_INJECTED,
            "Observe",
            ready.message.clone(),
        ));
    }
    let previous = route.condition(DEGRADED);
    let around = [SERVICE_BYPASSES_SIDECAR, NETWORK_POLICY_BLOCKS_SIDECAR];
    if around.contains(&degraded.reason) && previous.is_none_or(|c| c.message != degraded.message) {
        events.push(Note::on_route(
            EventType::Warning,
            degraded.reason,
            "Observe",
            degraded.message.clone(),
        ));
    }
    if !observed.overlaps.is_empty() && previous.is_none_or(|c| c.reason != OVERLAP) {
        events.push(Note::on_route(
            EventType::Warning,
            OVERLAP,
            "Validate",
            observed.overlaps.join("; "),
        ));
    }
    events
}

pub(super) fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(jiff::Timestamp::now()),
    }
}

/// Keeps lastTransitionTime when a condition's status did not change.
pub(super) fn carry_transitions(old: Option<&GraceRouteStatus>, new: &mut GraceRouteStatus) {
    let Some(old) = old else { return };
    for c in &mut new.conditions {
        if let Some(prev) = old.conditions.iter().find(|p| p.type_ == c.type_)
            && prev.status == c.status
        {
            c.last_transition_time = prev.last_transition_time.clone();
        }
    }
}

/// Status equality that ignores timestamps (no write when nothing changed).
pub(super) fn same_status(a: &GraceRouteStatus, b: &GraceRouteStatus) -> bool {
    let strip = |s: &GraceRouteStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}
