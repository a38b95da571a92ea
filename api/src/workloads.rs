//! The workloads a GraceRoute fronts, read from Deployments,
//! StatefulSets and Argo Rollouts already fetched (pure): what the route controller, the
//! admission webhook and the kubectl plugin all need to know of a target,
//! which targets a route selects, and which route holds a target two
//! routes select.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use kubegrace_sidecar_api::keys;
use serde::{Deserialize, Serialize};

use crate::argo::Rollout;
use crate::crd::{GraceRoute, TargetKind};

/// The target's rollout values before the first route touched them; written
/// once into an annotation on the target and restored on route deletion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Originals {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
}

/// What the route controller needs to know of a Deployment or StatefulSet.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: TargetKind,
    pub name: String,
    pub template: PodTemplateSpec,
    /// `RollingUpdate`, `Recreate` (Deployment), `OnDelete` (StatefulSet),
    /// [`CANARY`] or [`BLUE_GREEN`] (Rollout).
    pub strategy_type: Option<String>,
    pub current: Originals,
    /// The annotation [`keys::ORIGINAL`] if a route already wrote it.
    pub recorded: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

impl Target {
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// The route this target's pod template is pinned to.
    pub fn pinned_route(&self) -> Option<&str> {
        self.template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(keys::ROUTE))
            .map(String::as_str)
    }
}

pub fn selector_of(ls: &LabelSelector) -> Option<Selector> {
    Selector::try_from(ls.clone()).ok()
}

pub fn template_labels(t: &Target) -> BTreeMap<String, String> {
    t.template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// A workload's selector as a label-selector string for listing its pods.
pub fn pod_selector(ls: Option<&LabelSelector>) -> Option<String> {
    let s = selector_of(ls?)?;
    // An empty selector would select every pod in the namespace.
    (!s.selects_all()).then(|| s.to_string())
}

pub fn deployment_target(d: &Deployment) -> Option<(Target, Option<String>)> {
    let spec = d.spec.as_ref()?;
    let strategy = spec.strategy.as_ref();
    // The API server defaults these; None only for Recreate.
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let current = Originals {
        max_surge: rolling.and_then(|r| r.max_surge.clone()),
        max_unavailable: rolling.and_then(|r| r.max_unavailable.clone()),
        ..originals(&spec.template, spec.min_ready_seconds)
    };
    let strategy_type = strategy.and_then(|s| s.type_.clone());
    Some(target(
        TargetKind::Deployment,
        d,
        &spec.template,
        &spec.selector,
        strategy_type,
        current,
    ))
}

pub fn statefulset_target(s: &StatefulSet) -> Option<(Target, Option<String>)> {
    let spec = s.spec.as_ref()?;
    let strategy_type = spec.update_strategy.as_ref().and_then(|u| u.type_.clone());
    let current = originals(&spec.template, spec.min_ready_seconds);
    let kind = TargetKind::StatefulSet;
    Some(target(
        kind,
        s,
        &spec.template,
        &spec.selector,
        strategy_type,
        current,
    ))
}

/// An Argo Rollouts Rollout; None without a pod template (a Rollout that
/// takes it from a Deployment through `workloadRef`) or a selector.
pub fn rollout_target(r: &Rollout) -> Option<(Target, Option<String>)> {
    let spec = &r.spec;
    let template = spec.template.as_ref()?;
    let selector = spec.selector.as_ref()?;
    let strategy = spec.strategy.clone().unwrap_or_default();
    // A canary keeps the surge fields where a Deployment's rollingUpdate does.
    let canary = strategy.canary.unwrap_or_default();
    let mut current = originals(template, spec.min_ready_seconds);
    (current.max_surge, current.max_unavailable) = (canary.max_surge, canary.max_unavailable);
    // Argo Rollouts treats a Rollout without a blue-green block as a canary.
    let kind = if strategy.blue_green.is_some() {
        BLUE_GREEN
    } else {
        CANARY
    };
    let (target_kind, strategy_type) = (TargetKind::Rollout, Some(kind.to_string()));
    Some(target(
        target_kind,
        r,
        template,
        selector,
        strategy_type,
        current,
    ))
}

/// [`Target::strategy_type`] of a Rollout: which of Argo's strategies.
pub const CANARY: &str = "Canary";
/// See [`CANARY`].
pub const BLUE_GREEN: &str = "BlueGreen";

/// The rollout values every kind has, as the workload runs with them now
/// (a StatefulSet has no surge).
fn originals(template: &PodTemplateSpec, min_ready_seconds: Option<i32>) -> Originals {
    Originals {
        max_surge: None,
        max_unavailable: None,
        min_ready_seconds: Some(min_ready_seconds.unwrap_or(0)),
        termination_grace_period_seconds: Some(pod_grace_period(template.spec.as_ref())),
    }
}

/// The API server's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

/// A pod's (or template's) grace period, with the API server's default:
/// what a pod created now gets, compared with a route's budget.
pub fn pod_grace_period(spec: Option<&PodSpec>) -> i64 {
    spec.and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
}

/// What the workload kinds have in common as a [`Target`]: the name,
/// the annotations (with the originals a route recorded there), the pod
/// template and the selector of its pods; the kind-specific parts are
/// passed in.
fn target(
    kind: TargetKind,
    workload: &impl ResourceExt,
    template: &PodTemplateSpec,
    selector: &LabelSelector,
    strategy_type: Option<String>,
    current: Originals,
) -> (Target, Option<String>) {
    let annotations = workload.annotations().clone();
    let target = Target {
        kind,
        name: workload.name_any(),
        template: template.clone(),
        strategy_type,
        current,
        recorded: annotations.get(keys::ORIGINAL).cloned(),
        annotations,
    };
    (target, pod_selector(Some(selector)))
}

/// The workloads of one namespace, with the selectors of their pods.
pub struct Workloads(pub Vec<(Target, Option<String>)>);

impl Workloads {
    /// From objects already read (pure; the admission tests use it).
    pub fn from_objects(deployments: &[Deployment], statefulsets: &[StatefulSet]) -> Self {
        Self::from_all(deployments, statefulsets, &[])
    }

    /// [`Workloads::from_objects`] with the namespace's Argo Rollouts
    /// (none where Argo Rollouts is not installed).
    pub fn from_all(
        deployments: &[Deployment],
        statefulsets: &[StatefulSet],
        rollouts: &[Rollout],
    ) -> Self {
        Self(
            deployments
                .iter()
                .filter_map(deployment_target)
                .chain(statefulsets.iter().filter_map(statefulset_target))
                .chain(rollouts.iter().filter_map(rollout_target))
                .collect(),
        )
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
pub fn precedence(r: &GraceRoute) -> (Option<jiff::Timestamp>, String) {
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
