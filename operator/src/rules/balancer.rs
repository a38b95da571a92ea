//! The `drain.maxDelay` a route needs behind a cloud load balancer, from the balancer
//! settings the operator can read (issue 38, item 3): a balancer that sends to pod IPs keeps
//! sending to a deregistered pod for its own drain time, so the grace phase must be allowed
//! to last that long. Pure: the controller hands in the namespace's Services, the route's
//! pods and the GKE BackendConfigs the Services name; nothing here talks to the API server.
//!
//! Read today:
//! - AWS (aws-load-balancer-controller): `deregistration_delay.timeout_seconds=N` in the
//!   Service annotation `service.beta.kubernetes.io/aws-load-balancer-target-group-attributes`;
//! - GKE (ingress-gce): the BackendConfig named by the Service annotation
//!   `cloud.google.com/backend-config` (or its `beta.` twin), its
//!   `spec.connectionDraining.drainingTimeoutSec`.
//!
//! Only a route whose maxDelay is the CRD's default follows a balancer
//! ([`follows_balancer`]): the API server writes the schema's defaults into the stored
//! object, so a maxDelay left out and one written as the default look the same, and both
//! are raised (only slower, never lossy); any other value is the route's own. Only Services
//! that select at least one of the route's pods count. The longest setting wins (a longer
//! grace phase is only slower; a shorter one loses requests), and it never lowers the
//! route's maxDelay: a balancer's drain time says how long it may keep sending, not that
//! kube-proxy is faster. The result is bounded so that it plus the drain's effective
//! timeout stays within the CRD's bound ([`MAX_DRAIN`]), as a written maxDelay must.
//!
//! The controller applies it (`controller/balancer.rs`) between dereference and validate.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};

use crate::crd::DrainSpec;
use crate::crd::bounds::MAX_DRAIN;

/// The aws-load-balancer-controller's Service annotation of target group attributes
/// (`key=value` pairs, comma-separated).
pub const AWS_TARGET_GROUP_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
/// The attribute of [`AWS_TARGET_GROUP_ATTRIBUTES`] that is the target group's drain time.
pub const AWS_DEREGISTRATION_DELAY: &str = "deregistration_delay.timeout_seconds";
/// ingress-gce's Service annotation naming BackendConfigs (`{"default": name}` and/or
/// `{"ports": {port: name}}`), and its older twin.
pub const GKE_BACKEND_CONFIG: &str = "cloud.google.com/backend-config";
pub const GKE_BACKEND_CONFIG_BETA: &str = "beta.cloud.google.com/backend-config";

/// The largest drain time either cloud accepts (AWS: 0-3600 s; GCP: 0-3600 s). A larger
/// number is not a setting the balancer uses, so it is reported, not followed.
const CLOUD_MAX_SECONDS: u64 = 3600;

/// A balancer's drain time, and where it was read (for the route's status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerDelay {
    pub delay: Duration,
    /// E.g. `Service web: service.beta.kubernetes.io/aws-load-balancer-target-group-attributes
    /// deregistration_delay.timeout_seconds=120`.
    pub source: String,
}

/// What [`balancer_max_delay`] found: the delay to use (if any balancer setting is longer
/// than the route's own maxDelay) and the settings it could not read, each as a sentence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub max_delay: Option<BalancerDelay>,
    pub unreadable: Vec<String>,
}

/// Whether a route with this `drain.maxDelay` follows the balancers in front of its pods:
/// only at the CRD's default (written or left out; the API server fills it in either way).
pub fn follows_balancer(max_delay: Duration) -> bool {
    max_delay == DrainSpec::default().max_delay.get()
}

/// Whether Service `svc` sends to `pod`: a non-empty selector whose every pair is among the
/// pod's labels (a Service without a selector has hand-made endpoints; not followed).
pub fn selects(svc: &Service, pod: &Pod) -> bool {
    let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    let labels = pod.metadata.labels.as_ref();
    !selector.is_empty()
        && selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The AWS target group drain time in Service `svc`'s annotation: `Ok(None)` without the
/// annotation or the attribute, `Err` (a sentence) for a value that is not a number of
/// seconds within what AWS accepts.
pub fn aws_delay(svc: &Service) -> Result<Option<Duration>, String> {
    let Some(attrs) = annotation(svc, AWS_TARGET_GROUP_ATTRIBUTES) else {
        return Ok(None);
    };
    let Some(value) = attrs.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == AWS_DEREGISTRATION_DELAY).then(|| v.trim())
    }) else {
        return Ok(None);
    };
    seconds(value).map(Some).map_err(|why| {
        format!(
            "Service {}: {AWS_TARGET_GROUP_ATTRIBUTES} {AWS_DEREGISTRATION_DELAY}={value:?}: {why}",
            name(svc)
        )
    })
}

/// The BackendConfig names in Service `svc`'s annotation (the default and every port's),
/// sorted and without repeats; `Err` (a sentence) when the annotation is not the JSON
/// ingress-gce reads.
pub fn backend_config_names(svc: &Service) -> Result<Vec<String>, String> {
    let Some(text) =
        annotation(svc, GKE_BACKEND_CONFIG).or_else(|| annotation(svc, GKE_BACKEND_CONFIG_BETA))
    else {
        return Ok(Vec::new());
    };
    let unreadable = |why: &str| format!("Service {}: {GKE_BACKEND_CONFIG}: {why}", name(svc));
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| unreadable(&format!("not JSON ({e})")))?;
    let mut names: Vec<String> = Vec::new();
    if let Some(d) = v.get("default") {
        names.push(
            d.as_str()
                .ok_or_else(|| unreadable("default is not a name"))?
                .to_owned(),
        );
    }
    if let Some(ports) = v.get("ports") {
        let ports = ports
            .as_object()
            .ok_or_else(|| unreadable("ports is not an object"))?;
        for n in ports.values() {
            names.push(
                n.as_str()
                    .ok_or_else(|| unreadable("a port's value is not a name"))?
                    .to_owned(),
            );
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// A BackendConfig's `spec.connectionDraining.drainingTimeoutSec`: `Ok(None)` without it,
/// `Err` (why) for a value that is not a number of seconds GCP accepts.
pub fn gke_delay(backend_config: &serde_json::Value) -> Result<Option<Duration>, String> {
    match backend_config.pointer("/spec/connectionDraining/drainingTimeoutSec") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => {
            let secs = v.as_u64().ok_or_else(|| {
                format!("drainingTimeoutSec {v} is not a whole number of seconds")
            })?;
            seconds(&secs.to_string()).map(Some)
        }
    }
}

/// The maxDelay the balancers in front of `pods` need, if longer than the route's own
/// `max_delay`: the longest drain time of the Services that select any of `pods` (AWS
/// annotation, or the GKE BackendConfigs in `backend_configs`, by name), bounded so that
/// it plus `effective_timeout` stays within [`MAX_DRAIN`]. Settings that cannot be read
/// are listed, not guessed at; a BackendConfig a Service names that is not in
/// `backend_configs` is listed too.
pub fn balancer_max_delay<'a>(
    services: &[Service],
    pods: impl IntoIterator<Item = &'a Pod> + Clone,
    backend_configs: &BTreeMap<String, serde_json::Value>,
    max_delay: Duration,
    effective_timeout: Duration,
) -> Found {
    let mut found = Found::default();
    let mut best: Option<BalancerDelay> = None;
    let mut offer = |delay: Duration, source: String| {
        if best.as_ref().is_none_or(|b| delay > b.delay) {
            best = Some(BalancerDelay { delay, source });
        }
    };
    for svc in services {
        if !pods.clone().into_iter().any(|p| selects(svc, p)) {
            continue;
        }
        match aws_delay(svc) {
            Ok(Some(d)) => offer(
                d,
                format!(
                    "Service {}: {AWS_TARGET_GROUP_ATTRIBUTES} {AWS_DEREGISTRATION_DELAY}={}",
                    name(svc),
                    d.as_secs()
                ),
            ),
            Ok(None) => {}
            Err(why) => found.unreadable.push(why),
        }
        let names = match backend_config_names(svc) {
            Ok(names) => names,
            Err(why) => {
                found.unreadable.push(why);
                Vec::new()
            }
        };
        for bc in names {
            match backend_configs.get(&bc).map(gke_delay) {
                Some(Ok(Some(d))) => offer(
                    d,
                    format!(
                        "Service {} -> BackendConfig {bc}: connectionDraining.drainingTimeoutSec={}",
                        name(svc),
                        d.as_secs()
                    ),
                ),
                Some(Ok(None)) => {}
                Some(Err(why)) => found.unreadable.push(format!(
                    "Service {} -> BackendConfig {bc}: {why}",
                    name(svc)
                )),
                None => found.unreadable.push(format!(
                    "Service {} names BackendConfig {bc}, which was not found",
                    name(svc)
                )),
            }
        }
    }
    let ceiling = MAX_DRAIN.saturating_sub(effective_timeout);
    found.max_delay = best
        .filter(|b| b.delay > max_delay)
        .map(|b| {
            if b.delay > ceiling {
                BalancerDelay {
                    delay: ceiling,
                    source: format!(
                        "{} (capped at {}s: maxDelay plus the drain's timeout stays within {}s)",
                        b.source,
                        ceiling.as_secs(),
                        MAX_DRAIN.as_secs()
                    ),
                }
            } else {
                b
            }
        })
        // A ceiling at or below the route's own maxDelay leaves nothing to raise.
        .filter(|b| b.delay > max_delay);
    found
}

/// Whole seconds, 0 to [`CLOUD_MAX_SECONDS`].
fn seconds(text: &str) -> Result<Duration, String> {
    let n: u64 = text
        .parse()
        .map_err(|_| "not a whole number of seconds".to_owned())?;
    if n > CLOUD_MAX_SECONDS {
        return Err(format!("above the cloud's limit of {CLOUD_MAX_SECONDS}s"));
    }
    Ok(Duration::from_secs(n))
}

fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn name(svc: &Service) -> &str {
    svc.metadata.name.as_deref().unwrap_or("?")
}

#[cfg(test)]
#[path = "balancer_tests.rs"]
mod tests;
