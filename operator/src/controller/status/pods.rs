//! The pods of a route as the status step counts them (pure): how many
//! asked for the sidecar and carry it, which still run from a template that
//! predates injection, and the hints the Ready condition gives.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kubegrace_api::workloads::pod_grace_period;

use super::super::dereference::Observed;
use crate::crd::TargetKind;
use crate::keys;
use crate::rules::Target;

/// Running, injected pods whose grace period is shorter than the budget
/// (created before it grew).
pub(super) fn short_grace<'a>(pods: impl IntoIterator<Item = &'a Pod>, budget: i64) -> usize {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && crate::inject::is_injected(p))
        .filter(|p| pod_grace_period(p.spec.as_ref()) < budget)
        .count()
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

pub(super) fn rolling_out_message(first: &Outdated, outdated: usize, injected: i32) -> String {
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

pub(super) fn inject_hint(t: Option<&Target>, ns: &str) -> String {
    let how = match t {
        Some(t) => {
            let resource = match t.kind {
                TargetKind::Deployment => "deployment",
                TargetKind::StatefulSet => "statefulset",
                TargetKind::Rollout => "rollout.argoproj.io",
            };
            format!(
                "kubectl annotate {resource} {} {}=enabled",
                t.name,
                keys::INJECT
            )
        }
        None => format!("label the pods {}=enabled", keys::INJECT),
    };
    format!(
        "config applied, but no pod asks for the sidecar: {how} (or label namespace {ns} {}=enabled)",
        keys::INJECT
    )
}
