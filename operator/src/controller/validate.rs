//! Step 2, validate (pure): is the route usable as it stands? The time
//! budget fits, every target's pod template declares the route's ports, the
//! sidecar config passes the sidecar's own checks, and the ConfigMap the
//! route writes is absent or ours. The admission webhook runs the same
//! [`budget_and_config`], so `kubectl apply` and the route's conditions agree.

use kube::ResourceExt;

use super::dereference::Observed;
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

pub use kubegrace_api::bypass::service_bypasses;
