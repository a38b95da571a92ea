//! Reading the state of what a run created: pods ready, the sidecar injected, a
//! Deployment rolled out.

use anyhow::Result;
use k8s_openapi::api::core::v1::{Container, Event, Pod};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
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

/// The Events of namespace `ns` given for `reason` (`DrainForceClosed`, `RolloutPaused`).
pub async fn events_for(client: &Client, ns: &str, reason: &str) -> Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
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

pub(super) use crate::load::rollout::rolled_out;

pub(super) fn short(pod: &str) -> &str {
    pod.rsplit('-').next().unwrap_or(pod)
}
