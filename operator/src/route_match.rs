//! Which GraceRoute covers a workload: one answer, used by the route
//! controller (to map a changed Deployment/StatefulSet to its routes) and by
//! the inject propagation in [`crate::workload`] (to wait for an accepted
//! route before it rolls the pods), and for a pod being created by the
//! injecting webhook ([`pick_route`]: its pin, its owner, or a selector).

use std::borrow::Borrow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::crd::{GraceRoute, TargetKind};
use crate::keys;

/// Whether `route` targets the workload `kind`/`name` in `ns`, by
/// `targetRef` or by a (non-empty) selector matching its pod template's
/// labels (pure).
pub fn covers_workload(
    route: &GraceRoute,
    kind: TargetKind,
    ns: &str,
    name: &str,
    template_labels: &BTreeMap<String, String>,
) -> bool {
    if route.namespace().as_deref() != Some(ns) {
        return false;
    }
    match (&route.spec.target_ref, &route.spec.selector) {
        (Some(t), _) => t.kind == kind && t.name == name,
        (None, Some(s)) => Selector::try_from(s.clone())
            .ok()
            .is_some_and(|s| !s.selects_all() && s.matches(template_labels)),
        _ => false,
    }
}

/// Whether the route is live and the controller accepted it: pods created
/// now get the sidecar and its config (the webhook admits pods of a route
/// that is not accepted bare).
pub fn accepted(route: &GraceRoute) -> bool {
    route.metadata.deletion_timestamp.is_none()
        && route
            .condition(crate::controller::ACCEPTED)
            .is_some_and(|c| c.status == "True")
}

/// Whether a pod being created belongs to the workload a `targetRef`
/// names, from its owner reference (pure, no API call): a Deployment's
/// pods are owned by its ReplicaSet `<name>-<pod-template-hash>`, a
/// StatefulSet's by the StatefulSet. This is what lets the operator leave
/// the user's pod template alone (no route pin in it).
pub fn owned_by(pod: &Pod, target: &crate::crd::TargetRef) -> bool {
    let hash = pod.labels().get("pod-template-hash");
    pod.owner_references().iter().any(|o| match target.kind {
        TargetKind::Deployment => {
            o.kind == "ReplicaSet" && hash.is_some_and(|h| o.name == format!("{}-{h}", target.name))
        }
        TargetKind::StatefulSet => o.kind == "StatefulSet" && o.name == target.name,
        // Argo Rollouts names its ReplicaSets like the Deployment
        // controller, from its own hash label.
        TargetKind::Rollout => {
            let hash = pod.labels().get(kubegrace_api::argo::POD_TEMPLATE_HASH);
            o.kind == "ReplicaSet" && hash.is_some_and(|h| o.name == format!("{}-{h}", target.name))
        }
    })
}

/// Picks the route for a pod: the one it is pinned to (annotation), else
/// the oldest whose targetRef owns it or whose selector matches its labels
/// (pure; the controller's overlap rule, [`precedence`]).
pub fn pick_route<'a, R: Borrow<GraceRoute>>(pod: &Pod, routes: &'a [R]) -> Option<&'a GraceRoute> {
    let mut live = routes
        .iter()
        .map(Borrow::borrow)
        .filter(|r| r.metadata.deletion_timestamp.is_none());
    if let Some(pinned) = pod.annotations().get(keys::ROUTE) {
        return live.find(|r| &r.name_any() == pinned);
    }
    live.filter(|r| match (&r.spec.target_ref, &r.spec.selector) {
        (Some(t), _) => owned_by(pod, t),
        (None, Some(s)) => Selector::try_from(s.clone())
            .ok()
            .is_some_and(|s| !s.selects_all() && s.matches(pod.labels())),
        _ => false,
    })
    .min_by_key(|r| precedence(r))
}

/// The overlap rule, in one place (the API crate, which the plugin shares):
/// of two routes that select the same workload or pod, the older holds it
/// (creation time, then name). The controller's
/// [`claim_targets`](crate::controller::claim_targets) and the webhook's
/// [`pick_route`] both order by it.
pub use kubegrace_api::workloads::precedence;
