//! Reading the state of what a run created: pods ready, the sidecar injected, a
//! Deployment rolled out.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::DynamicObject;
use kubegrace_sidecar_api::pod;

/// Every container of the pod, init containers (where a native sidecar
/// sits) first.
pub fn all_containers(p: &Pod) -> Vec<&Container> {
    p.spec
        .iter()
        .flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
        })
        .collect()
}

/// Whether the pod has the injected sidecar container.
pub fn has_sidecar(p: &Pod) -> bool {
    all_containers(p).iter().any(|c| c.name == pod::CONTAINER)
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Condition `type_` of a GraceRoute's status: (status, reason, message), empty strings
/// where the route has no such condition yet.
pub fn route_condition(route: &DynamicObject, type_: &str) -> (String, String, String) {
    let c = route.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_default();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

/// Ok when the Deployment's controller has seen its spec and every replica is updated,
/// ready and available, with no extra pod counted.
pub(super) fn rolled_out(d: &Deployment) -> std::result::Result<(), String> {
    let generation = d.metadata.generation.unwrap_or(0);
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    if s.observed_generation.unwrap_or(0) < generation {
        return Err("the Deployment controller has not seen the change yet".into());
    }
    let updated = s.updated_replicas.unwrap_or(0);
    let ready = s.ready_replicas.unwrap_or(0);
    let available = s.available_replicas.unwrap_or(0);
    let total = s.replicas.unwrap_or(0);
    if updated == want && ready == want && available == want && total == want {
        Ok(())
    } else {
        Err(format!(
            "{updated} updated, {ready} ready, {available} available of {want} ({total} counted)"
        ))
    }
}

pub(super) fn short(pod: &str) -> &str {
    pod.rsplit('-').next().unwrap_or(pod)
}
