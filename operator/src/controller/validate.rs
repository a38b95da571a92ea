//! Step 2, validate (pure): is the route usable as it stands? The time
//! budget fits, every target's pod template declares the route's ports, the
//! sidecar config passes the sidecar's own checks, and the ConfigMap the
//! route writes is absent or ours. The admission webhook runs the same
//! [`budget_and_config`], so `kubectl apply` and the route's conditions agree.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use super::dereference::{Observed, template_labels};
use crate::crd::GraceRoute;
use crate::ownership::{self, Ownership};
use crate::rules::{self, Budget, Invalid, Target};

/// A route that passed: its budget and the sidecar config it renders to.
#[derive(Debug, Clone)]
pub struct Valid {
    pub budget: Budget,
    pub config: kubegrace_sidecar_api::config::Config,
}

/// Validates `route` against what was observed (pure).
pub fn check(route: &GraceRoute, observed: &Observed) -> Result<Valid, Invalid> {
    let (budget, config) = budget_and_config(route, &observed.target_refs())?;
    // Never take over, or through the owner reference delete, a ConfigMap
    // that someone else made under the route's ConfigMap name.
    let name = route.name_any();
    if let Ownership::Foreign(why) = ownership::decide(observed.config_map.as_ref(), &name) {
        return Err(ownership::refusal(
            &route.namespace().unwrap_or_default(),
            &rules::config_map_name(&name),
            &name,
            &why,
        ));
    }
    Ok(Valid { budget, config })
}

/// The time budget and the sidecar config (pure), checked against the pod
/// template of every target the route holds. The CRD's bounds come first
/// (an object stored under an older, looser CRD must not reach the budget's
/// arithmetic), the rendered ConfigMap's size last. The controller turns an
/// [`Invalid`] into `Accepted=False`; the admission webhook refuses the
/// route with the same message.
pub fn budget_and_config(
    route: &GraceRoute,
    targets: &[&(Target, Option<String>)],
) -> Result<(Budget, kubegrace_sidecar_api::config::Config), Invalid> {
    rules::check_bounds(route)?;
    let budget = rules::budget(&route.spec)?;
    let mut plan = None;
    for (t, _) in targets {
        let p = rules::check_template(&route.spec, &t.id(), &t.template)?;
        plan.get_or_insert(p);
    }
    let config = rules::sidecar_config(&route.spec, &budget, plan)?;
    let (yaml, _) = rules::render(&config)?;
    rules::check_rendered_size(&yaml)?;
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
        .filter_map(|(t, _)| rules::app_port(&t.template, &port.name))
        .collect();
    let mut out = Vec::new();
    for n in numbers {
        for b in rules::bypassing_services(services, &labels, &port.name, n) {
            let s = b.explain(&port.name);
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}
