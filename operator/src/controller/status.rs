//! Step 5, status (pure): the route's conditions and the Events to publish,
//! from what was observed and what was applied. Events go out on changes
//! only (compared with the status the route had), so a resync publishes
//! nothing. [`write`] is the edge that sends them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::build::Desired;
use super::dereference::Observed;
use super::validate::{Valid, service_bypasses};
use super::{
    ACCEPTED, Context, DEGRADED, NETWORK_POLICY_BLOCKS_SIDECAR, READY, SERVICE_BYPASSES_SIDECAR,
};
use crate::crd::{GraceRoute, GraceRouteStatus, TargetKind};
use crate::rules::{self, Invalid, Target};
use crate::{Error, Result, keys};

/// An Event to publish on the route.
#[derive(Debug, Clone)]
pub struct Note {
    pub type_: EventType,
    pub reason: String,
    pub action: &'static str,
    pub note: String,
}

impl Note {
    fn new(type_: EventType, reason: &str, action: &'static str, note: String) -> Self {
        Self {
            type_,
            reason: reason.into(),
            action,
            note,
        }
    }
}

/// The status to write and the Events to publish.
#[derive(Debug, Clone)]
pub struct Report {
    pub status: GraceRouteStatus,
    pub events: Vec<Note>,
}

impl Report {
    /// Whether the route is Ready (the resync period depends on it).
    pub fn ready(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == READY && c.status == "True")
    }
}

/// A route that did not validate: `Accepted=False` with the reason (pure).
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
            condition(DEGRADED, false, "NotApplied", "", generation),
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
        events.push(Note::new(
            EventType::Warning,
            invalid.reason,
            "Validate",
            invalid.message.clone(),
        ));
    }
    Report { status, events }
}

/// Running, injected pods whose grace period is shorter than the budget
/// (created before it grew).
fn short_grace<'a>(pods: impl IntoIterator<Item = &'a Pod>, budget: i64) -> usize {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && crate::inject::is_injected(p))
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
                < budget
        })
        .count()
}

/// A route that was applied: Accepted, Ready from the pods, Degraded from
/// overlaps, bare pods and bypassing Services (pure).
pub fn accepted(
    route: &GraceRoute,
    observed: &Observed,
    valid: &Valid,
    desired: &Desired,
) -> Report {
    let generation = route.metadata.generation;
    let old = route.status.clone().unwrap_or_default();
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let budget = &valid.budget;
    let hash = &desired.hash;
    let targets = &observed.targets;
    let overlaps = &observed.overlaps;
    let count = count_pods(observed.pods.values(), &observed.ns_labels);
    let outdated = outdated_pods(observed);
    let short_grace = short_grace(observed.pods.values(), budget.seconds);
    let pod_labels: Vec<BTreeMap<String, String>> =
        observed.pods.values().map(|p| p.labels().clone()).collect();
    let bypasses = service_bypasses(
        route,
        &observed.target_refs(),
        &pod_labels,
        &observed.services,
    );

    let blocked: Vec<String> =
        crate::netpol::blocked(observed.pods.values(), &observed.network_policies)
            .iter()
            .map(|b| {
                let (what, fix) = b.explain();
                format!("{what}; fix: {fix}")
            })
            .collect();
    let target_ids = observed.target_ids();
    let mut accepted_msg = format!("time budget {}s: {}", budget.seconds, budget.explain());
    if budget.seconds != budget.required_seconds {
        accepted_msg.push_str(&format!(
            " (terminationGracePeriodSeconds pinned to {})",
            budget.seconds
        ));
    }
    if let Some((r, t)) = &budget.longest_route {
        accepted_msg.push_str(&format!(
            "; drain.timeout raised to {} for route {r:?}",
            kubegrace_sidecar_api::config::HumanDuration(*t)
        ));
    }
    for n in &desired.notes {
        accepted_msg.push_str("; ");
        accepted_msg.push_str(n);
    }
    if short_grace > 0 {
        accepted_msg.push_str(&format!(
            "; {short_grace} running pods have a shorter terminationGracePeriodSeconds (set when they were created); they get {}s when they are next replaced",
            budget.seconds
        ));
    }
    let (ready, ready_reason, ready_msg) = if targets.is_empty() && route.spec.target_ref.is_some()
    {
        let t = route
            .spec
            .target_ref
            .as_ref()
            .map(|t| format!("{}/{}", t.kind, t.name))
            .unwrap_or_default();
        if overlaps.is_empty() {
            (
                false,
                "TargetNotFound",
                format!("{t} does not exist in namespace {ns}; create it or fix spec.targetRef"),
            )
        } else {
            (false, "Overlap", overlaps.join("; "))
        }
    } else if targets.is_empty() && count.expected == 0 && count.injected == 0 {
        (
            false,
            "NoTargets",
            "no Deployment, StatefulSet or pod matches spec.selector".to_string(),
        )
    } else if let Some((pod, why)) = count.missing.first() {
        let why = why
            .clone()
            .unwrap_or_else(|| "the webhook never saw it (down, or failurePolicy Ignore)".into());
        (
            false,
            "PodsNotInjected",
            format!(
                "{} of {} pods lack the sidecar, e.g. {pod}: {why}; fix the cause, then delete those pods or roll the workload",
                count.missing.len(),
                count.expected
            ),
        )
    } else if let Some(first) = outdated.first() {
        (
            false,
            "RollingOut",
            rolling_out_message(first, outdated.len(), count.injected),
        )
    } else if count.expected == 0 {
        (
            false,
            "InjectionNotEnabled",
            inject_hint(targets.first().map(|t| &t.0), &ns),
        )
    } else {
        (
            true,
            "Fronted",
            format!(
                "{}/{} pods carry the sidecar with config {hash}",
                count.injected, count.expected
            ),
        )
    };
    let (degraded, degraded_reason, degraded_msg) = if !overlaps.is_empty() {
        (
            true,
            "Overlap",
            format!(
                "{}; delete one route or narrow its selector",
                overlaps.join("; ")
            ),
        )
    } else if !count.missing.is_empty() {
        (true, "PodsNotInjected", ready_msg.clone())
    } else if !bypasses.is_empty() {
        (true, SERVICE_BYPASSES_SIDECAR, bypasses.join("; "))
    } else if !blocked.is_empty() {
        (true, NETWORK_POLICY_BLOCKS_SIDECAR, blocked.join("; "))
    } else {
        (false, "AsExpected", String::new())
    };
    let status = GraceRouteStatus {
        observed_generation: generation,
        conditions: vec![
            condition(ACCEPTED, true, "Valid", accepted_msg, generation),
            condition(READY, ready, ready_reason, ready_msg.clone(), generation),
            condition(
                DEGRADED,
                degraded,
                degraded_reason,
                degraded_msg.clone(),
                generation,
            ),
        ],
        targets: target_ids.clone(),
        target_count: i32::try_from(target_ids.len()).unwrap_or(i32::MAX),
        pods_injected: count.injected,
        pods_expected: count.expected,
        injected: Some(format!("{}/{}", count.injected, count.expected)),
        budget_seconds: Some(budget.seconds),
        budget: Some(format!("{}s", budget.seconds)),
        config_map: Some(rules::config_map_name(&name)),
        config_hash: Some(hash.clone()),
        // Folded in by the controller from the drain reports it collected.
        last_drains: old.last_drains.clone(),
    };

    // Events, on changes only.
    let mut events = Vec::new();
    if old.budget_seconds != Some(budget.seconds) && !targets.is_empty() {
        events.push(Note::new(EventType::Normal,
            "BudgetApplied",
            "Apply",
            format!(
                "terminationGracePeriodSeconds {} for new pods of {} ({}), set by the webhook at pod creation; the workload is not edited",
                budget.seconds,
                target_ids.join(", "),
                budget.explain()
            ),
        ));
    }
    if old.config_hash.as_deref() != Some(hash.as_str()) {
        events.push(Note::new(
            EventType::Normal,
            "ConfigApplied",
            "Apply",
            format!(
                "sidecar config {hash} written to ConfigMap {}; running sidecars reload it",
                rules::config_map_name(&name)
            ),
        ));
    }
    let was_missing = route
        .condition(READY)
        .is_some_and(|c| c.reason == "PodsNotInjected" && c.message == ready_msg);
    if !count.missing.is_empty() && !was_missing {
        events.push(Note::new(
            EventType::Warning,
            "PodsNotInjected",
            "Observe",
            ready_msg.clone(),
        ));
    }
    if (degraded_reason == SERVICE_BYPASSES_SIDECAR
        || degraded_reason == NETWORK_POLICY_BLOCKS_SIDECAR)
        && route
            .condition(DEGRADED)
            .is_none_or(|c| c.message != degraded_msg)
    {
        events.push(Note::new(
            EventType::Warning,
            degraded_reason,
            "Observe",
            degraded_msg.clone(),
        ));
    }
    if !overlaps.is_empty()
        && route
            .condition(DEGRADED)
            .is_none_or(|c| c.reason != "Overlap")
    {
        events.push(Note::new(
            EventType::Warning,
            "Overlap",
            "Validate",
            overlaps.join("; "),
        ));
    }
    Report { status, events }
}

/// Sends the report: the Events, then the status (no write when only
/// timestamps would change).
pub async fn write(
    ctx: &Context,
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    report: Report,
) -> Result<()> {
    for e in report.events {
        super::publish(ctx, route, e.type_, &e.reason, e.action, e.note).await;
    }
    let mut status = report.status;
    carry_transitions(route.status.as_ref(), &mut status);
    let ns = route.namespace().unwrap_or_default();
    for change in super::decisions::changes(route.status.as_ref(), &status) {
        tracing::info!(namespace = %ns, route = %route.name_any(), "{change}");
    }
    if route
        .status
        .as_ref()
        .is_some_and(|old| same_status(old, &status))
    {
        return Ok(());
    }
    api.patch_status(
        &route.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map_err(Error::kube(format!(
        "writing status of GraceRoute {}",
        route.name_any()
    )))?;
    Ok(())
}

fn condition(
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
pub(crate) fn carry_transitions(old: Option<&GraceRouteStatus>, new: &mut GraceRouteStatus) {
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
pub(crate) fn same_status(a: &GraceRouteStatus, b: &GraceRouteStatus) -> bool {
    let strip = |s: &GraceRouteStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

/// Pods fronted vs pods that should be.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodCount {
    pub expected: i32,
    pub injected: i32,
    /// Pods that asked for the sidecar and do not have it, with the reason
    /// the webhook left on them if it saw them at all.
    pub missing: Vec<(String, Option<String>)>,
}

/// A live pod a target's rollout has yet to replace: its workload asks for the
/// sidecar now, the pod was created from an earlier template that did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outdated {
    pub pod: String,
    pub target: String,
    /// The target replaces its pods only when they are deleted (a StatefulSet
    /// with `updateStrategy: OnDelete`).
    pub on_delete: bool,
}

/// The live pods of the targets that predate the sidecar (pure). Until they
/// are gone the workload serves traffic that kubegrace does not front, so the
/// route is not Ready: `kubectl wait --for=condition=Ready` then means what it
/// says.
pub fn outdated_pods(observed: &Observed) -> Vec<Outdated> {
    let mut out = Vec::new();
    for (target, selector) in &observed.targets {
        let Some(names) = selector
            .as_ref()
            .and_then(|s| observed.pods_by_selector.get(s))
        else {
            continue;
        };
        if !template_wants_sidecar(target, &observed.ns_labels) {
            continue;
        }
        for name in names {
            let Some(pod) = observed.pods.get(name) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_none()
                && !crate::inject::is_injected(pod)
                && !crate::inject::wants_injection(pod, &observed.ns_labels)
            {
                out.push(Outdated {
                    pod: name.clone(),
                    target: target.id(),
                    on_delete: target.strategy_type.as_deref() == Some("OnDelete"),
                });
            }
        }
    }
    out
}

/// Whether the target's pods are to carry the sidecar: its pod template asks
/// (label or annotation, or the namespace's label), or the workload itself is
/// annotated and the operator is about to copy that into the template.
fn template_wants_sidecar(target: &Target, ns_labels: &BTreeMap<String, String>) -> bool {
    let template = Pod {
        metadata: target.template.metadata.clone().unwrap_or_default(),
        ..Pod::default()
    };
    if crate::inject::wants_injection(&template, ns_labels) {
        return true;
    }
    fn says(m: Option<&BTreeMap<String, String>>) -> Option<&str> {
        m.and_then(|m| m.get(keys::INJECT)).map(String::as_str)
    }
    let template_disabled = says(template.metadata.labels.as_ref()) == Some("disabled")
        || says(template.metadata.annotations.as_ref()) == Some("disabled");
    !template_disabled && says(Some(&target.annotations)) == Some("enabled")
}

fn rolling_out_message(first: &Outdated, outdated: usize, injected: i32) -> String {
    let how = if first.on_delete {
        format!(
            "{} replaces pods only when they are deleted (updateStrategy OnDelete): delete them",
            first.target
        )
    } else {
        format!(
            "the rollout replaces them: kubectl rollout status {}",
            first.target.to_lowercase()
        )
    };
    format!(
        "{injected} pods carry the sidecar; {outdated} still run without it, created before injection was enabled (e.g. {}); {how}",
        first.pod
    )
}

/// Counts pods (pure): `expected` are live pods asking for the sidecar.
pub fn count_pods<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    ns_labels: &BTreeMap<String, String>,
) -> PodCount {
    let mut c = PodCount::default();
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let injected = crate::inject::is_injected(p);
        if injected {
            c.injected += 1;
        }
        if crate::inject::wants_injection(p, ns_labels) {
            c.expected += 1;
            if !injected {
                c.missing.push((
                    p.name_any(),
                    p.annotations().get(keys::INJECT_SKIPPED).cloned(),
                ));
            }
        }
    }
    c
}

fn inject_hint(t: Option<&Target>, ns: &str) -> String {
    let how = match t {
        Some(t) if t.kind == TargetKind::Deployment => {
            format!(
                "kubectl annotate deployment {} {}=enabled",
                t.name,
                keys::INJECT
            )
        }
        Some(t) => format!(
            "kubectl annotate statefulset {} {}=enabled",
            t.name,
            keys::INJECT
        ),
        None => format!("label the pods {}=enabled", keys::INJECT),
    };
    format!(
        "config applied, but no pod asks for the sidecar: {how} (or label namespace {ns} {}=enabled)",
        keys::INJECT
    )
}

#[cfg(test)]
#[path = "status_netpol_tests.rs"]
mod netpol_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::READY;

    fn pod(yaml: &str) -> Pod {
        serde_norway::from_str(yaml).expect("pod")
    }

    #[test]
    fn drift_counts_pods_that_asked_and_did_not_get_the_sidecar() {
        let injected = pod(
            "metadata: {name: a, labels: {kubegrace.io/inject: enabled}, annotations: {kubegrace.io/injected: 'true'}}",
        );
        let bare = pod("metadata: {name: b, labels: {kubegrace.io/inject: enabled}}");
        let skipped = pod(
            "metadata: {name: c, labels: {kubegrace.io/inject: enabled}, annotations: {kubegrace.io/inject-skipped: no port}}",
        );
        let not_asking = pod("metadata: {name: d}");
        let c = count_pods([&injected, &bare, &skipped, &not_asking], &BTreeMap::new());
        assert_eq!((c.expected, c.injected), (3, 1));
        assert_eq!(
            c.missing,
            vec![
                ("b".to_string(), None),
                ("c".to_string(), Some("no port".to_string()))
            ]
        );
        let ns_on = BTreeMap::from([(keys::INJECT.to_string(), "enabled".to_string())]);
        assert_eq!(count_pods([&not_asking], &ns_on).expected, 1);
    }

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let mut old = GraceRouteStatus {
            conditions: vec![condition(READY, true, "Fronted", "1/1", Some(1))],
            ..Default::default()
        };
        old.conditions[0].last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        let mut new = GraceRouteStatus {
            conditions: vec![condition(READY, true, "Fronted", "1/1", Some(1))],
            ..Default::default()
        };
        carry_transitions(Some(&old), &mut new);
        assert!(same_status(&old, &new));
        assert_eq!(
            new.conditions[0].last_transition_time,
            old.conditions[0].last_transition_time
        );
    }

    use crate::controller::fixtures::{DEPLOYMENT, ROUTE, observed, route};
    use crate::controller::{build, validate as check};

    const INJECTED_POD: &str = "metadata: {name: web-1, namespace: shop, labels: {app: web, kubegrace.io/inject: enabled}, annotations: {kubegrace.io/injected: 'true'}}\nspec: {terminationGracePeriodSeconds: 60, containers: []}";

    fn accepted_report(r: &GraceRoute, seen: &Observed) -> Report {
        let valid = check::check(r, seen).expect("valid");
        let d = build::desired(r, &valid, seen).expect("desired");
        accepted(r, seen, &valid, &d)
    }

    fn cond<'a>(report: &'a Report, type_: &str) -> &'a Condition {
        report
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition")
    }

    #[test]
    fn a_fronted_target_is_ready_and_the_first_pass_announces_budget_and_config() {
        let r = route(ROUTE);
        let seen = observed(&r, &[DEPLOYMENT], &[pod(INJECTED_POD)]);
        let report = accepted_report(&r, &seen);
        assert!(report.ready());
        assert_eq!(cond(&report, READY).reason, "Fronted");
        assert_eq!(report.status.injected.as_deref(), Some("1/1"));
        let reasons: Vec<&str> = report.events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["BudgetApplied", "ConfigApplied"]);

        // The same observation again, with the status written: nothing to say.
        let mut again = r.clone();
        again.status = Some(report.status.clone());
        let second = accepted_report(&again, &seen);
        assert!(second.events.is_empty(), "{:?}", second.events);
        assert!(same_status(&report.status, &second.status));
    }

    #[test]
    fn pods_from_before_injection_keep_the_route_not_ready_until_the_rollout_replaces_them() {
        let r = route(ROUTE);
        // Created from the template before it asked for the sidecar.
        let old = "metadata: {name: web-old-1, namespace: shop, labels: {app: web}}\nspec: {containers: []}";
        let report = accepted_report(
            &r,
            &observed(&r, &[DEPLOYMENT], &[pod(INJECTED_POD), pod(old)]),
        );
        let ready = cond(&report, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "RollingOut")
        );
        assert!(
            ready.message.contains("1 still run without it")
                && ready.message.contains("web-old-1")
                && ready
                    .message
                    .contains("kubectl rollout status deployment/web"),
            "{}",
            ready.message
        );
        // Mid-rollout is not a fault.
        assert_eq!(cond(&report, DEGRADED).status, "False");

        // Terminating: the rollout is done with it.
        let leaving = "metadata: {name: web-old-1, namespace: shop, labels: {app: web}, deletionTimestamp: '2026-12-03T10:00:00Z'}\nspec: {containers: []}";
        let report = accepted_report(
            &r,
            &observed(&r, &[DEPLOYMENT], &[pod(INJECTED_POD), pod(leaving)]),
        );
        assert_eq!(cond(&report, READY).reason, "Fronted");

        // Annotated a moment ago: the template does not ask yet, the workload does, and
        // no pod has been replaced: rolling out, not "injection not enabled".
        let annotated = DEPLOYMENT
            .replace("kubegrace.io/inject: enabled", "tier: web")
            .replace(
                "metadata: {name: web, namespace: shop}",
                "metadata: {name: web, namespace: shop, annotations: {kubegrace.io/inject: enabled}}",
            );
        let report = accepted_report(&r, &observed(&r, &[annotated.as_str()], &[pod(old)]));
        assert_eq!(cond(&report, READY).reason, "RollingOut");

        // Not asked for at all: the old answer with its hint.
        let plain = DEPLOYMENT.replace("kubegrace.io/inject: enabled", "tier: web");
        let report = accepted_report(&r, &observed(&r, &[plain.as_str()], &[pod(old)]));
        assert_eq!(cond(&report, READY).reason, "InjectionNotEnabled");
    }

    #[test]
    fn a_missing_target_and_a_bare_pod_are_conditions_with_the_fix() {
        let r = route(ROUTE);
        let missing = accepted_report(&r, &observed(&r, &[], &[]));
        let ready = cond(&missing, READY);
        assert_eq!(ready.reason, "TargetNotFound");
        assert!(
            ready
                .message
                .contains("Deployment/web does not exist in namespace shop"),
            "{}",
            ready.message
        );
        assert_eq!(cond(&missing, ACCEPTED).status, "True");

        let bare = pod(
            "metadata: {name: web-2, namespace: shop, labels: {app: web, kubegrace.io/inject: enabled}, annotations: {kubegrace.io/inject-skipped: no GraceRoute selects this pod}}",
        );
        let report = accepted_report(&r, &observed(&r, &[DEPLOYMENT], &[bare]));
        let ready = cond(&report, READY);
        assert_eq!(ready.reason, "PodsNotInjected");
        assert!(
            ready
                .message
                .contains("web-2: no GraceRoute selects this pod"),
            "{}",
            ready.message
        );
        assert_eq!(cond(&report, DEGRADED).status, "True");
        assert!(report.events.iter().any(|e| e.reason == "PodsNotInjected"));
    }

    #[test]
    fn an_invalid_route_is_not_accepted_and_warns_once_per_message() {
        let r = route(&ROUTE.replace("ports: [{name: http}]", "ports: [{name: nope}]"));
        let seen = observed(&r, &[DEPLOYMENT], &[]);
        let invalid = check::check(&r, &seen).expect_err("unknown port");
        let report = rejected(&r, &seen, &invalid);
        let accepted = cond(&report, ACCEPTED);
        assert_eq!(
            (accepted.status.as_str(), accepted.reason.as_str()),
            ("False", invalid.reason)
        );
        assert!(accepted.message.contains("nope"), "{}", accepted.message);
        assert_eq!(report.events.len(), 1);
        let mut again = r.clone();
        again.status = Some(report.status.clone());
        assert!(rejected(&again, &seen, &invalid).events.is_empty());
    }
}
