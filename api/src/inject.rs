//! What a pod says about the sidecar, read by the webhook that injects
//! it, the controllers that count it and the kubectl plugin that checks
//! it: whether it asks for the sidecar, whether it has it, the sidecar's
//! admin port, the name the app's port gets, and whether the API server
//! runs the sidecar natively.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kubegrace_sidecar_api::{admin, keys, pod};

/// The admin port of an injected pod: the sidecar's [`admin::PORT_NAME`]
/// port (what the webhook chose for this pod), for callers of its admin API.
pub fn admin_port_of(pod: &Pod) -> Option<u16> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| c.name == pod::CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(admin::PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// A new name for the app's port: `kg-<name>`, within the 15 characters a
/// port name may have, not taken by another port of the pod.
pub fn app_port_name(name: &str, taken: &BTreeSet<String>) -> String {
    let base: String = format!("kg-{name}").chars().take(15).collect();
    let base = base.trim_end_matches('-').to_string();
    if !taken.contains(&base) {
        return base;
    }
    (0..100)
        .map(|i| {
            let suffix = format!("-{i}");
            let stem: String = base.chars().take(15 - suffix.len()).collect();
            format!("{}{suffix}", stem.trim_end_matches('-'))
        })
        .find(|n| !taken.contains(n))
        .unwrap_or(base)
}

fn annotations(pod: &Pod) -> Option<&BTreeMap<String, String>> {
    pod.metadata.annotations.as_ref()
}

/// Already injected (by us, earlier: the webhook may be called twice with
/// reinvocationPolicy, or a pod may be re-submitted).
pub fn is_injected(pod: &Pod) -> bool {
    annotations(pod).is_some_and(|a| a.contains_key(keys::INJECTED))
        || pod.spec.as_ref().is_some_and(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .any(|c| c.name == pod::CONTAINER)
        })
}

/// Whether a pod asks for the sidecar: its own label or annotation wins
/// (`disabled` opts out of a labelled namespace), else the namespace label.
/// The label is what the webhook configuration's objectSelector sees; the
/// operator copies a workload's annotation into both.
pub fn wants_injection(pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
    own_choice(pod).unwrap_or_else(|| {
        namespace_labels
            .get(keys::INJECT)
            .is_some_and(|v| v == "enabled")
    })
}

/// What the pod's own inject label or annotation says, if either decides
/// (`disabled` wins over `enabled`); `None` leaves it to the namespace, so
/// the webhook reads the namespace only then.
pub fn own_choice(pod: &Pod) -> Option<bool> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::INJECT))
        .map(String::as_str);
    let annotation = annotations(pod)
        .and_then(|a| a.get(keys::INJECT))
        .map(String::as_str);
    if label == Some("disabled") || annotation == Some("disabled") {
        return Some(false);
    }
    if label == Some("enabled") || annotation == Some("enabled") {
        return Some(true);
    }
    None
}

/// Whether a native sidecar works for kubegrace on this API server: 1.33 and
/// newer. Native sidecars (init containers with restartPolicy Always) are on
/// by default from 1.29, but the port takeover moves the port *name* a
/// Service targets onto the sidecar, and before 1.33 the endpoints
/// controller resolves a named targetPort in regular containers only: the
/// Service gets no endpoints (seen on 1.30.14 by `make version-matrix`).
pub fn supports_native(major: &str, minor: &str) -> bool {
    let major: u32 = major.trim_end_matches('+').parse().unwrap_or(0);
    let minor: u32 = minor.trim_end_matches('+').parse().unwrap_or(0);
    major > 1 || (major == 1 && minor >= 33)
}
