//! The GraceRoute controller.
//!
//! Level-triggered and idempotent; every pass runs the whole pipeline:
//! dereference (targets, overlapping routes, pods) -> validate -> build
//! (pure, [`crate::build`]) -> apply (server-side apply as
//! `kubegrace-operator`: the sidecar ConfigMap, owned by the route, and the
//! target's rollout fields) -> status (+ Events on changes).
//!
//! A finalizer restores what the route changed on its targets when it is
//! deleted (the originals live in an annotation on the target); the
//! ConfigMap goes with the route through its owner reference.
//!
//! Errors: an invalid route is not an error, it is a status (`Accepted=False`)
//! and waits for a change; API failures are errors and are retried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::admin::Metrics;
use crate::build::{self, Budget, Invalid, Originals, Target};
use crate::crd::{GraceRoute, GraceRouteStatus, TargetKind};
use crate::{Error, FIELD_MANAGER, FINALIZER, RESTORE_FIELD_MANAGER, Result, keys};

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// All routes, for overlap detection and for mapping watched objects.
    pub routes: Store<GraceRoute>,
}

/// The condition types.
pub const ACCEPTED: &str = "Accepted";
pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
/// Degraded reason: a Service selecting the route's pods reaches the app
/// around the sidecar (its targetPort is the app's number).
pub const SERVICE_BYPASSES_SIDECAR: &str = "ServiceBypassesSidecar";

fn selector_of(ls: &LabelSelector) -> Option<Selector> {
    Selector::try_from(ls.clone()).ok()
}

fn template_labels(t: &Target) -> BTreeMap<String, String> {
    t.template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// A workload's selector as a label-selector string for listing its pods.
fn pod_selector(ls: Option<&LabelSelector>) -> Option<String> {
    let s = selector_of(ls?)?;
    // An empty selector would select every pod in the namespace.
    (!s.selects_all()).then(|| s.to_string())
}

pub fn deployment_target(d: &Deployment) -> Option<(Target, Option<String>)> {
    let spec = d.spec.as_ref()?;
    let strategy = spec.strategy.as_ref();
    let ru = strategy.and_then(|s| s.rolling_update.as_ref());
    let current = Originals {
        // The API server defaults these; None only for Recreate.
        max_surge: ru.and_then(|r| r.max_surge.clone()),
        max_unavailable: ru.and_then(|r| r.max_unavailable.clone()),
        min_ready_seconds: Some(spec.min_ready_seconds.unwrap_or(0)),
        termination_grace_period_seconds: Some(
            spec.template
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30),
        ),
    };
    let annotations = d.annotations().clone();
    Some((
        Target {
            kind: TargetKind::Deployment,
            name: d.name_any(),
            template: spec.template.clone(),
            strategy_type: strategy.and_then(|s| s.type_.clone()),
            current,
            recorded: annotations.get(keys::ORIGINAL).cloned(),
            annotations,
        },
        pod_selector(Some(&spec.selector)),
    ))
}

pub fn statefulset_target(s: &StatefulSet) -> Option<(Target, Option<String>)> {
    let spec = s.spec.as_ref()?;
    let current = Originals {
        max_surge: None,
        max_unavailable: None,
        min_ready_seconds: Some(spec.min_ready_seconds.unwrap_or(0)),
        termination_grace_period_seconds: Some(
            spec.template
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30),
        ),
    };
    let annotations = s.annotations().clone();
    Some((
        Target {
            kind: TargetKind::StatefulSet,
            name: s.name_any(),
            template: spec.template.clone(),
            strategy_type: spec.update_strategy.as_ref().and_then(|u| u.type_.clone()),
            current,
            recorded: annotations.get(keys::ORIGINAL).cloned(),
            annotations,
        },
        pod_selector(Some(&spec.selector)),
    ))
}

/// The workloads of one namespace, with the selectors of their pods.
pub struct Workloads(pub Vec<(Target, Option<String>)>);

impl Workloads {
    /// From objects already read (pure; the admission tests use it).
    pub fn from_objects(deployments: &[Deployment], statefulsets: &[StatefulSet]) -> Self {
        Self(
            deployments
                .iter()
                .filter_map(deployment_target)
                .chain(statefulsets.iter().filter_map(statefulset_target))
                .collect(),
        )
    }

    pub async fn list(client: &Client, ns: &str) -> Result<Self> {
        let lp = ListParams::default();
        let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .map_err(Error::kube(format!("listing Deployments in {ns}")))?;
        let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .map_err(Error::kube(format!("listing StatefulSets in {ns}")))?;
        Ok(Self::from_objects(&deployments.items, &statefulsets.items))
    }

    /// The targets a route selects.
    pub fn of(&self, route: &GraceRoute) -> Vec<&(Target, Option<String>)> {
        if let Some(r) = &route.spec.target_ref {
            return self
                .0
                .iter()
                .filter(|(t, _)| t.kind == r.kind && t.name == r.name)
                .collect();
        }
        let Some(sel) = route.spec.selector.as_ref().and_then(selector_of) else {
            return Vec::new();
        };
        if sel.selects_all() {
            return Vec::new();
        }
        self.0
            .iter()
            .filter(|(t, _)| sel.matches(&template_labels(t)))
            .collect()
    }
}

/// Routes earlier in this order win a contested target.
fn precedence(r: &GraceRoute) -> (Option<jiff::Timestamp>, String) {
    (
        r.metadata.creation_timestamp.as_ref().map(|t| t.0),
        r.name_any(),
    )
}

/// The targets a route selects, split into those it holds and the overlaps:
/// targets an older route of the same namespace holds already, each with a
/// sentence saying so (pure; the controller and the admission webhook share
/// it, so both report the same overlaps).
pub fn claim_targets<'w>(
    route: &GraceRoute,
    workloads: &'w Workloads,
    others: &[&GraceRoute],
) -> (Vec<&'w (Target, Option<String>)>, Vec<String>) {
    let name = route.name_any();
    let ns = route.namespace();
    let mut overlaps = Vec::new();
    let mut targets = Vec::new();
    for t in workloads.of(route) {
        let holder = others.iter().find(|other| {
            other.name_any() != name
                && other.namespace() == ns
                && other.metadata.deletion_timestamp.is_none()
                && precedence(other) < precedence(route)
                && workloads.of(other).iter().any(|o| o.0.id() == t.0.id())
        });
        match holder {
            Some(other) => overlaps.push(format!(
                "{} is also targeted by GraceRoute {} (older, in force)",
                t.0.id(),
                other.name_any()
            )),
            None => targets.push(t),
        }
    }
    (targets, overlaps)
}

/// Validate + build (pure): the time budget and the sidecar config, checked
/// against the pod template of every target the route holds. The controller
/// turns an [`Invalid`] into `Accepted=False`; the admission webhook refuses
/// the route with the same message.
pub fn validate(
    route: &GraceRoute,
    targets: &[&(Target, Option<String>)],
) -> Result<(Budget, kubegrace_sidecar::config::Config), Invalid> {
    let budget = build::budget(&route.spec)?;
    let mut plan = None;
    for (t, _) in targets {
        let p = build::check_template(&route.spec, &t.id(), &t.template)?;
        plan.get_or_insert(p);
    }
    let config = build::sidecar_config(&route.spec, &budget, plan)?;
    Ok((budget, config))
}

/// The Services that select the route's pods (its targets' templates and
/// `pods`, label sets of pods already seen) but reach the app around the
/// sidecar, each as the sentence with its fix (pure; the controller and the
/// admission webhook share it).
pub fn service_bypasses(
    route: &GraceRoute,
    targets: &[&(Target, Option<String>)],
    pods: &[BTreeMap<String, String>],
    services: &[Service],
) -> Vec<String> {
    let Some(port) = route.spec.ports.first() else {
        return Vec::new();
    };
    let mut labels: Vec<BTreeMap<String, String>> =
        targets.iter().map(|(t, _)| template_labels(t)).collect();
    labels.extend(pods.iter().cloned());
    let numbers: BTreeSet<i32> = targets
        .iter()
        .filter_map(|(t, _)| build::app_port(&t.template, &port.name))
        .collect();
    let mut out = Vec::new();
    for n in numbers {
        for b in build::bypassing_services(services, &labels, &port.name, n) {
            let s = b.explain(&port.name);
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// Maps a Deployment/StatefulSet to the routes that may target it.
fn routes_for_workload(
    store: &Store<GraceRoute>,
    kind: TargetKind,
    ns: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<GraceRoute>> {
    store
        .state()
        .iter()
        .filter(|r| crate::route_match::covers_workload(r, kind, ns, name, labels))
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// Maps a pod to the route it is pinned to, or the routes selecting it.
fn routes_for_pod(store: &Store<GraceRoute>, pod: &Pod) -> Vec<ObjectRef<GraceRoute>> {
    let ns = pod.namespace().unwrap_or_default();
    if let Some(name) = pod.annotations().get(keys::ROUTE) {
        return vec![ObjectRef::new(name).within(&ns)];
    }
    let labels = pod.labels();
    store
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
        .filter(|r| {
            r.spec
                .selector
                .as_ref()
                .and_then(selector_of)
                .is_some_and(|s| !s.selects_all() && s.matches(labels))
        })
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
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
fn carry_transitions(old: Option<&GraceRouteStatus>, new: &mut GraceRouteStatus) {
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
fn same_status(a: &GraceRouteStatus, b: &GraceRouteStatus) -> bool {
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

pub async fn reconcile(route: Arc<GraceRoute>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    let ns = route
        .namespace()
        .ok_or_else(|| Error::MissingField("GraceRoute without namespace".into()))?;
    let api: Api<GraceRoute> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, route, |event| async {
        match event {
            Finalizer::Apply(r) => apply(&r, &ctx).await,
            Finalizer::Cleanup(r) => cleanup(&r, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconciled(start.elapsed(), result.as_ref().err().map(Error::kind));
    result
}

pub fn error_policy(_route: Arc<GraceRoute>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, kind = err.kind(), "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

async fn publish(
    ctx: &Context,
    route: &GraceRoute,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &route.object_ref(&())).await {
        // Events are for people; a failed one must not fail the reconcile.
        tracing::debug!(error = %e, "publishing event");
    }
}

async fn write_status(
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    mut status: GraceRouteStatus,
) -> Result<()> {
    carry_transitions(route.status.as_ref(), &mut status);
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

async fn apply(route: &GraceRoute, ctx: &Context) -> Result<Action> {
    let client = &ctx.client;
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let api: Api<GraceRoute> = Api::namespaced(client.clone(), &ns);
    let generation = route.metadata.generation;
    let old = route.status.clone().unwrap_or_default();

    // ---- dereference: targets, minus those an older route already holds
    let workloads = Workloads::list(client, &ns).await?;
    let known = ctx.routes.state();
    let others: Vec<&GraceRoute> = known.iter().map(AsRef::as_ref).collect();
    let (targets, overlaps) = claim_targets(route, &workloads, &others);

    // ---- validate + build (pure)
    // (+ the ConfigMap kubegrace-<route> must be absent or ours: never take
    // over or, through the owner reference, delete someone else's.)
    let checked = match validate(route, &targets) {
        Ok(v) => crate::ownership::check(client, route).await?.map(|()| v),
        Err(invalid) => Err(invalid),
    };
    let (budget, config) = match checked {
        Ok(v) => v,
        Err(invalid) => {
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
                targets: targets.iter().map(|t| t.0.id()).collect(),
                target_count: i32::try_from(targets.len()).unwrap_or(i32::MAX),
                ..old.clone()
            };
            if route
                .condition(ACCEPTED)
                .is_none_or(|c| c.message != invalid.message)
            {
                publish(
                    ctx,
                    route,
                    EventType::Warning,
                    invalid.reason,
                    "Validate",
                    invalid.message.clone(),
                )
                .await;
            }
            write_status(&api, route, status).await?;
            // A foreign ConfigMap is not watched (the watch is label-selected):
            // look again now and then. Otherwise nothing changes until the
            // route or a target does; watches bring us back.
            if invalid.reason == crate::ownership::REASON {
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            return Ok(Action::await_change());
        }
    };
    let (yaml, hash) = build::render(&config).map_err(|i| Error::Config(i.message))?;

    // ---- apply: ConfigMap (owned by the route; hot-reloaded by the sidecars)
    let cm_name = build::config_map_name(&name);
    let owner = route
        .controller_owner_ref(&())
        .ok_or_else(|| Error::MissingField("GraceRoute without uid".into()))?;
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(cm_name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(BTreeMap::from([
                (keys::MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
                (keys::ROUTE_LABEL.to_string(), name.clone()),
            ])),
            annotations: Some(BTreeMap::from([(
                keys::CONFIG_HASH.to_string(),
                hash.clone(),
            )])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("config.yaml".to_string(), yaml)])),
        ..Default::default()
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch(&cm_name, &pp, &Patch::Apply(&cm))
        .await
        .map_err(Error::kube(format!("applying ConfigMap {ns}/{cm_name}")))?;

    // ---- apply: the rollout fields of an explicit `rollout` block, nothing
    // else (the grace period reaches pods through the webhook, so GitOps
    // re-applies of the user's manifest and budget changes roll nothing)
    let mut notes = Vec::new();
    for (t, _) in &targets {
        let (body, n) = build::target_apply(route.spec.rollout.as_ref(), t);
        notes.extend(n);
        let Some(body) = body else { continue };
        let result = match t.kind {
            TargetKind::Deployment => Api::<Deployment>::namespaced(client.clone(), &ns)
                .patch(&t.name, &pp, &Patch::Apply(&body))
                .await
                .map(drop),
            TargetKind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), &ns)
                .patch(&t.name, &pp, &Patch::Apply(&body))
                .await
                .map(drop),
        };
        result.map_err(Error::kube(format!(
            "applying rollout fields to {}",
            t.id()
        )))?;
    }

    // ---- observe: pods fronted vs expected
    let ns_labels = Api::<Namespace>::all(client.clone())
        .get_opt(&ns)
        .await
        .map_err(Error::kube(format!("reading namespace {ns}")))?
        .map(|n| n.labels().clone())
        .unwrap_or_default();
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let mut selectors: BTreeSet<String> = targets.iter().filter_map(|t| t.1.clone()).collect();
    if let Some(s) = pod_selector(route.spec.selector.as_ref()) {
        selectors.insert(s);
    }
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    for s in &selectors {
        let list = pods_api
            .list(&ListParams::default().labels(s))
            .await
            .map_err(Error::kube(format!("listing pods {s} in {ns}")))?;
        for p in list {
            pods.insert(p.name_any(), p);
        }
    }
    let count = count_pods(pods.values(), &ns_labels);
    let short_grace = pods
        .values()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && crate::inject::is_injected(p))
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
                < budget.seconds
        })
        .count();

    // ---- observe: Services that reach the app around the sidecar
    let services = Api::<Service>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing Services in {ns}")))?
        .items;
    let pod_labels: Vec<BTreeMap<String, String>> =
        pods.values().map(|p| p.labels().clone()).collect();
    let bypasses = service_bypasses(route, &targets, &pod_labels, &services);

    // ---- status
    let target_ids: Vec<String> = targets.iter().map(|t| t.0.id()).collect();
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
            kubegrace_sidecar::config::HumanDuration(*t)
        ));
    }
    for n in &notes {
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
    } else if count.expected == 0 {
        (
            false,
            "InjectionNotEnabled",
            inject_hint(targets.first().map(|t| &t.0), &ns),
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
        config_map: Some(cm_name),
        config_hash: Some(hash.clone()),
    };

    // ---- events, on changes only
    if old.budget_seconds != Some(budget.seconds) && !targets.is_empty() {
        publish(
            ctx,
            route,
            EventType::Normal,
            "BudgetApplied",
            "Apply",
            format!(
                "terminationGracePeriodSeconds {} for new pods of {} ({}), set by the webhook at pod creation; the workload is not edited",
                budget.seconds,
                target_ids.join(", "),
                budget.explain()
            ),
        )
        .await;
    }
    if old.config_hash.as_deref() != Some(hash.as_str()) {
        publish(
            ctx,
            route,
            EventType::Normal,
            "ConfigApplied",
            "Apply",
            format!(
                "sidecar config {hash} written to ConfigMap {}; running sidecars reload it",
                build::config_map_name(&name)
            ),
        )
        .await;
    }
    let was_missing = route
        .condition(READY)
        .is_some_and(|c| c.reason == "PodsNotInjected" && c.message == ready_msg);
    if !count.missing.is_empty() && !was_missing {
        publish(
            ctx,
            route,
            EventType::Warning,
            "PodsNotInjected",
            "Observe",
            ready_msg.clone(),
        )
        .await;
    }
    if degraded_reason == SERVICE_BYPASSES_SIDECAR
        && route
            .condition(DEGRADED)
            .is_none_or(|c| c.message != degraded_msg)
    {
        publish(
            ctx,
            route,
            EventType::Warning,
            SERVICE_BYPASSES_SIDECAR,
            "Observe",
            degraded_msg.clone(),
        )
        .await;
    }
    if !overlaps.is_empty()
        && route
            .condition(DEGRADED)
            .is_none_or(|c| c.reason != "Overlap")
    {
        publish(
            ctx,
            route,
            EventType::Warning,
            "Overlap",
            "Validate",
            overlaps.join("; "),
        )
        .await;
    }
    write_status(&api, route, status).await?;
    // Pods and workloads are watched; the periodic pass only catches drift
    // a watch could have missed.
    Ok(Action::requeue(Duration::from_secs(if ready {
        300
    } else {
        30
    })))
}

/// Route deleted: put back what it changed on its targets (in one write per
/// target, so pods roll at most once), then let go of the fields.
async fn cleanup(route: &GraceRoute, ctx: &Context) -> Result<Action> {
    let client = &ctx.client;
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let workloads = Workloads::list(client, &ns).await?;
    let known = ctx.routes.state();
    let others: Vec<&GraceRoute> = known.iter().map(AsRef::as_ref).collect();
    let (held, _) = claim_targets(route, &workloads, &others);
    for (t, _) in held {
        // Only targets this route wrote to (an explicit rollout block, or a
        // pin from an earlier version): an overlapping, newer route never
        // wrote anything, and a route without rollout block wrote nothing.
        if t.recorded.is_none() && t.pinned_route() != Some(name.as_str()) {
            continue;
        }
        let empty = json!({
            "apiVersion": "apps/v1",
            "kind": t.kind.to_string(),
            "metadata": {"name": t.name},
        });
        let restore = build::restore_patch(t);
        let res = match t.kind {
            TargetKind::Deployment => {
                restore_one(
                    Api::<Deployment>::namespaced(client.clone(), &ns),
                    &t.name,
                    restore.as_ref(),
                    &empty,
                )
                .await
            }
            TargetKind::StatefulSet => {
                restore_one(
                    Api::<StatefulSet>::namespaced(client.clone(), &ns),
                    &t.name,
                    restore.as_ref(),
                    &empty,
                )
                .await
            }
        };
        match res {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(Error::kube(format!("restoring {}", t.id()))(e)),
        }
        publish(
            ctx,
            route,
            EventType::Normal,
            "Restored",
            "Cleanup",
            format!(
                "{} got its original rollout fields and grace period back",
                t.id()
            ),
        )
        .await;
    }
    Ok(Action::await_change())
}

/// Puts the originals back (merge patch, its own field manager), then
/// releases every field `kubegrace-operator` applied (an empty apply).
async fn restore_one<K>(
    api: Api<K>,
    name: &str,
    restore: Option<&serde_json::Value>,
    empty: &serde_json::Value,
) -> std::result::Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(p) = restore {
        let merge = PatchParams {
            field_manager: Some(RESTORE_FIELD_MANAGER.into()),
            ..Default::default()
        };
        api.patch(name, &merge, &Patch::Merge(p)).await?;
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(empty),
    )
    .await?;
    Ok(())
}

/// Runs the route controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    identity: String,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // One namespace (watch-namespaces mode, namespaced RBAC) or all.
    let ns = namespace.as_deref();
    let routes = crate::scope::api::<GraceRoute>(&client, ns);
    let controller = Controller::new(routes, watcher::Config::default().any_semantic());
    let store = controller.store();
    let (s1, s2, s3, s4) = (store.clone(), store.clone(), store.clone(), store.clone());
    let managed =
        watcher::Config::default().labels(&format!("{}={}", keys::MANAGED_BY, FIELD_MANAGER));
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(identity),
            },
        ),
        client: client.clone(),
        metrics,
        routes: store,
    });
    let tpl_labels = |m: Option<&ObjectMeta>| m.and_then(|m| m.labels.clone()).unwrap_or_default();
    controller
        .owns(crate::scope::api::<ConfigMap>(&client, ns), managed)
        .watches(
            crate::scope::api::<Deployment>(&client, ns),
            watcher::Config::default(),
            move |d| {
                let labels = tpl_labels(d.spec.as_ref().and_then(|s| s.template.metadata.as_ref()));
                let ns = d.namespace().unwrap_or_default();
                routes_for_workload(&s1, TargetKind::Deployment, &ns, &d.name_any(), &labels)
            },
        )
        .watches(
            crate::scope::api::<StatefulSet>(&client, ns),
            watcher::Config::default(),
            move |s| {
                let labels = tpl_labels(s.spec.as_ref().and_then(|s| s.template.metadata.as_ref()));
                let ns = s.namespace().unwrap_or_default();
                routes_for_workload(&s2, TargetKind::StatefulSet, &ns, &s.name_any(), &labels)
            },
        )
        .watches(
            crate::scope::api::<Pod>(&client, ns),
            watcher::Config::default(),
            move |p| routes_for_pod(&s3, &p),
        )
        // A Service created or changed after the route can bypass its
        // sidecars; every route of the namespace re-checks (cheap, pure).
        .watches(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            move |svc| {
                let ns = svc.namespace();
                s4.state()
                    .iter()
                    .filter(|r| r.namespace() == ns)
                    .map(|r| ObjectRef::from_obj(r.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(route = %obj, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("pod")
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
}
