//! The status step's conditions and Events, from inline YAML.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::conditions::{carry_transitions, condition, same_status};
use super::*;
use crate::controller::dereference::Observed;
use crate::crd::GraceRoute;
use crate::keys;
use crate::reasons::{ACCEPTED, DEGRADED, DRAIN_FORCE_CLOSED, READY};
use crate::testing::yaml;

#[test]
fn drift_counts_pods_that_asked_and_did_not_get_the_sidecar() {
    let injected = yaml::<Pod>(
        "metadata: {name: a, labels: {kubegrace.io/inject: enabled}, annotations: {kubegrace.io/injected: 'true'}}",
    );
    let bare = yaml::<Pod>("metadata: {name: b, labels: {kubegrace.io/inject: enabled}}");
    let skipped = yaml::<Pod>(
        "metadata: {name: c, labels: {kubegrace.io/inject: enabled}, annotations: {kubegrace.io/inject-skipped: no port}}",
    );
    let not_asking = yaml::<Pod>("metadata: {name: d}");
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

use crate::controller::fixtures::{
    DEPLOYMENT, ROUTE, at, checked, condition_of, drain, observed, route, state,
};

const INJECTED_POD: &str = "metadata: {name: web-1, namespace: shop, labels: {app: web, kubegrace.io/inject: enabled}, annotations: {kubegrace.io/injected: 'true'}}\nspec: {terminationGracePeriodSeconds: 60, containers: []}";

fn accepted_report(r: &GraceRoute, seen: &Observed) -> Report {
    let (valid, d) = checked(r, seen);
    accepted(r, seen, &valid, &d)
}

/// The report of `r` when [`DEPLOYMENT`] runs an injected pod and `pod`.
fn beside_an_injected_pod(r: &GraceRoute, pod: &str) -> Report {
    let pods = [yaml::<Pod>(INJECTED_POD), yaml::<Pod>(pod)];
    accepted_report(r, &observed(r, &[DEPLOYMENT], &pods))
}

/// The condition has `reason`, and its message says `text`.
fn assert_says(c: &Condition, reason: &str, text: &str) {
    assert_eq!(c.reason, reason, "{}", c.message);
    assert!(c.message.contains(text), "{}", c.message);
}

fn cond<'a>(report: &'a Report, type_: &str) -> &'a Condition {
    condition_of(&report.status, type_)
}

#[test]
fn a_fronted_target_is_ready_and_the_first_pass_announces_budget_and_config() {
    let r = route(ROUTE);
    let seen = observed(&r, &[DEPLOYMENT], &[yaml::<Pod>(INJECTED_POD)]);
    let report = accepted_report(&r, &seen);
    assert!(report.ready());
    assert_eq!(cond(&report, READY).reason, "Fronted");
    assert_eq!(report.status.injected.as_deref(), Some("1/1"));
    let reasons: Vec<&str> = report.events.iter().map(|e| e.reason).collect();
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
    let old =
        "metadata: {name: web-old-1, namespace: shop, labels: {app: web}}\nspec: {containers: []}";
    let report = beside_an_injected_pod(&r, old);
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
    let report = beside_an_injected_pod(&r, leaving);
    assert_eq!(cond(&report, READY).reason, "Fronted");

    // Annotated a moment ago: the template does not ask yet, the workload does, and
    // no pod has been replaced: rolling out, not "injection not enabled".
    let annotated = DEPLOYMENT
        .replace("kubegrace.io/inject: enabled", "tier: web")
        .replace(
            "metadata: {name: web, namespace: shop}",
            "metadata: {name: web, namespace: shop, annotations: {kubegrace.io/inject: enabled}}",
        );
    let report = accepted_report(
        &r,
        &observed(&r, &[annotated.as_str()], &[yaml::<Pod>(old)]),
    );
    assert_eq!(cond(&report, READY).reason, "RollingOut");

    // Not asked for at all: the old answer with its hint.
    let plain = DEPLOYMENT.replace("kubegrace.io/inject: enabled", "tier: web");
    let report = accepted_report(&r, &observed(&r, &[plain.as_str()], &[yaml::<Pod>(old)]));
    assert_eq!(cond(&report, READY).reason, "InjectionNotEnabled");
}

#[test]
fn a_missing_target_and_a_bare_pod_are_conditions_with_the_fix() {
    let r = route(ROUTE);
    let missing = accepted_report(&r, &observed(&r, &[], &[]));
    assert_says(
        cond(&missing, READY),
        "TargetNotFound",
        "Deployment/web does not exist in namespace shop",
    );
    assert_eq!(cond(&missing, ACCEPTED).status, "True");

    let bare = yaml::<Pod>(
        "metadata: {name: web-2, namespace: shop, labels: {app: web, kubegrace.io/inject: enabled}, annotations: {kubegrace.io/inject-skipped: no GraceRoute selects this pod}}",
    );
    let report = accepted_report(&r, &observed(&r, &[DEPLOYMENT], &[bare]));
    assert_says(
        cond(&report, READY),
        "PodsNotInjected",
        "web-2: no GraceRoute selects this pod",
    );
    assert_eq!(cond(&report, DEGRADED).status, "True");
    assert!(report.events.iter().any(|e| e.reason == "PodsNotInjected"));
}

#[test]
fn an_invalid_route_is_not_accepted_and_warns_once_per_message() {
    let r = route(&ROUTE.replace("ports: [{name: http}]", "ports: [{name: nope}]"));
    let seen = observed(&r, &[DEPLOYMENT], &[]);
    let invalid = crate::controller::validate::check(&r, &seen).expect_err("unknown port");
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

fn lossy_drain() -> crate::controller::drains::PodDrain {
    drain("web-1", 1, 1, None)
}

#[test]
fn a_lossy_drain_is_counted_and_announced_on_the_route_and_on_its_workload() {
    let r = route(ROUTE);
    let seen = observed(&r, &[DEPLOYMENT], &[yaml::<Pod>(INJECTED_POD)]);
    let plan = plan_of(&r, &seen, None, vec![lossy_drain()]);
    assert!(plan.changed);
    assert_eq!(plan.pause, None, "pauseOnDrainLoss is off");
    let last = plan.status.last_drains.as_ref().expect("totals");
    assert_eq!((last.pods, last.force_closed), (1, 1));
    let drained: Vec<(&crate::controller::context::Subject, &str)> = plan
        .events
        .iter()
        .filter(|e| e.reason == DRAIN_FORCE_CLOSED)
        .map(|e| (&e.on, e.note.as_str()))
        .collect();
    assert_eq!(drained.len(), 2, "{drained:?}");
    assert_eq!(drained[0].0, &crate::controller::context::Subject::Route);
    assert_eq!(
        drained[1].0,
        &crate::controller::context::Subject::Workload {
            kind: crate::crd::TargetKind::Deployment,
            name: "web".into()
        }
    );
    assert!(
        drained[1].1.starts_with("GraceRoute web: pod web-1"),
        "{}",
        drained[1].1
    );

    // Written and counted: the same report again changes nothing.
    let mut again = r.clone();
    again.status = Some(plan.status.clone());
    let next = plan_of(
        &again,
        &seen,
        plan.status.last_drains.clone(),
        vec![lossy_drain()],
    );
    assert!(!next.changed, "{:?}", next.decisions);
    assert!(next.events.is_empty(), "{:?}", next.events);
    assert!(next.decisions.is_empty(), "{:?}", next.decisions);
}

fn plan_of(
    r: &GraceRoute,
    seen: &Observed,
    written: Option<crate::crd::LastDrains>,
    taken: Vec<crate::controller::drains::PodDrain>,
) -> Plan {
    plan(r, seen, accepted_report(r, seen), written, taken, at(0))
}

#[test]
fn with_pause_on_drain_loss_a_lossy_drain_of_a_rolling_deployment_plans_its_pause() {
    use crate::controller::pause::{DRAIN_LOSS, ROLLOUT_PAUSED};
    let r = route(&format!("{ROUTE}  rollout: {{pauseOnDrainLoss: true}}\n"));
    let mut seen = observed(&r, &[DEPLOYMENT], &[yaml::<Pod>(INJECTED_POD)]);
    seen.rollouts = vec![state(
        crate::crd::TargetKind::Deployment,
        "web",
        false,
        true,
    )];
    let plan = plan_of(&r, &seen, None, vec![lossy_drain()]);
    assert_eq!(
        plan.pause,
        Some((crate::crd::TargetKind::Deployment, "web".into()))
    );
    let paused = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == ROLLOUT_PAUSED)
        .expect("RolloutPaused");
    assert_eq!(
        (paused.status.as_str(), paused.reason.as_str()),
        ("True", DRAIN_LOSS)
    );
    let announced: Vec<_> = plan
        .events
        .iter()
        .filter(|e| e.reason == ROLLOUT_PAUSED)
        .collect();
    assert_eq!(announced.len(), 2, "on the route and on the Deployment");
    assert!(announced[0].related.is_some());

    // Not rolling (a scale-down): nothing to pause, no condition.
    seen.rollouts[0].progressing = false;
    let plan = plan_of(&r, &seen, None, vec![lossy_drain()]);
    assert_eq!(plan.pause, None);
    assert!(
        plan.status
            .conditions
            .iter()
            .all(|c| c.type_ != ROLLOUT_PAUSED)
    );
}
