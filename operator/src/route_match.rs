//! Which GraceRoute covers a workload: one answer, used by the route
//! controller (to map a changed Deployment/StatefulSet to its routes) and by
//! the inject propagation in [`crate::workload`] (to wait for an accepted
//! route before it rolls the pods). The webhook's per-pod answer is
//! [`crate::webhook::pick_route`], which adds the pod's owner and pin.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::crd::{GraceRoute, TargetKind};

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
            .condition("Accepted")
            .is_some_and(|c| c.status == "True")
}
