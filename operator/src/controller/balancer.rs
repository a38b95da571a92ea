//! The route as the rest of the pipeline sees it behind a cloud load balancer: a route
//! whose `drain.maxDelay` is the default gets the longest drain time of the balancers in
//! front of its pods ([`crate::rules::balancer`]) when that is longer than its default,
//! so the ConfigMap, the budget and the status all follow it; [`note`] writes where the
//! value came from into the `Accepted` condition.
//!
//! Between dereference and validate: [`effective`] reads only what the Services that
//! select the route's pods name (a GKE BackendConfig per name, no list), so a namespace
//! without such annotations costs no API call.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use kubegrace_sidecar_api::config::HumanDuration;

use super::dereference::{Error, Observed};
use super::status::Report;
use super::{ACCEPTED, Context};
use crate::crd::{Duration, GraceRoute};
use crate::rules::balancer::{
    BalancerDelay, backend_config_names, balancer_max_delay, follows_balancer, selects,
};

/// A route whose `drain.maxDelay` a balancer raised, and why.
#[derive(Debug, Clone)]
pub struct Balanced {
    pub route: GraceRoute,
    pub delay: BalancerDelay,
}

/// `route` with `drain.maxDelay` raised to what the balancers in front of its pods need,
/// or `None` when the route's maxDelay is its own (not the default), no balancer setting
/// is longer, or the route is invalid anyway (validation reports that). Settings it
/// cannot read are logged and left out.
pub async fn effective(
    ctx: &Context,
    route: &GraceRoute,
    observed: &Observed,
) -> Result<Option<Balanced>, Error> {
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    if !follows_balancer(route.spec.drain.max_delay.get()) {
        return Ok(None);
    }
    let Ok(budget) = crate::rules::budget(&route.spec) else {
        return Ok(None);
    };
    let selecting: Vec<&Service> = observed
        .services
        .iter()
        .filter(|s| observed.pods.values().any(|p| selects(s, p)))
        .collect();
    let names: BTreeSet<String> = selecting
        .iter()
        .filter_map(|s| backend_config_names(s).ok())
        .flatten()
        .collect();
    let configs = backend_configs(&ctx.client, &ns, &names).await?;
    let found = balancer_max_delay(
        &observed.services,
        observed.pods.values(),
        &configs,
        route.spec.drain.max_delay.get(),
        budget.effective_timeout(),
    );
    for why in &found.unreadable {
        tracing::info!(namespace = %ns, route = %name, "load balancer setting not followed: {why}");
    }
    Ok(found.max_delay.map(|delay| {
        let mut route = route.clone();
        route.spec.drain.max_delay = Duration(HumanDuration(delay.delay));
        Balanced { route, delay }
    }))
}

/// Adds where `drain.maxDelay` came from to the `Accepted` condition's message.
pub fn note(report: &mut Report, balanced: Option<&Balanced>) {
    let Some(b) = balanced else { return };
    if let Some(c) = report
        .status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == ACCEPTED)
    {
        c.message = format!(
            "{}; drain.maxDelay {}s from the load balancer ({})",
            c.message,
            b.delay.delay.as_secs(),
            b.delay.source
        );
    }
}

/// GKE's BackendConfig (ingress-gce's CRD).
fn backend_config_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cloud.google.com", "v1", "BackendConfig"),
        "backendconfigs",
    )
}

/// The BackendConfigs `names` in `ns` that exist, by name. Absent ones (or no such CRD:
/// not GKE) are left out, and the rule reports them; without the chart's read permission
/// (a chart of an earlier release) none are read.
async fn backend_configs(
    client: &Client,
    ns: &str,
    names: &BTreeSet<String>,
) -> Result<BTreeMap<String, serde_json::Value>, Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &backend_config_resource());
    let mut out = BTreeMap::new();
    for name in names {
        match api.get(name).await {
            Ok(obj) => {
                out.insert(name.clone(), obj.data);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tracing::debug!(namespace = %ns, "may not read BackendConfigs; their draining timeouts are not followed");
                return Ok(BTreeMap::new());
            }
            Err(source) => {
                return Err(Error::Read {
                    what: format!("reading BackendConfig {ns}/{name}"),
                    source,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration as StdDuration;

    use super::*;
    use crate::crd::GraceRouteStatus;
    use crate::testing::yaml;

    fn message<'a>(r: &'a Report, type_: &str) -> Option<&'a str> {
        r.status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.message.as_str())
    }

    fn report() -> Report {
        Report {
            status: GraceRouteStatus {
                conditions: vec![
                    yaml(
                        "{type: Accepted, status: 'True', reason: Valid, message: 'time budget 70s', lastTransitionTime: '2026-01-01T00:00:00Z'}",
                    ),
                    yaml(
                        "{type: Ready, status: 'True', reason: Ready, message: 'ready', lastTransitionTime: '2026-01-01T00:00:00Z'}",
                    ),
                ],
                ..GraceRouteStatus::default()
            },
            events: Vec::new(),
        }
    }

    #[test]
    fn the_accepted_message_says_where_max_delay_came_from() {
        let balanced = Balanced {
            route: yaml(
                "metadata: {name: web}\nspec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}",
            ),
            delay: BalancerDelay {
                delay: StdDuration::from_secs(45),
                source: "Service web-nlb: x=45".into(),
            },
        };
        let mut r = report();
        note(&mut r, Some(&balanced));
        assert_eq!(
            message(&r, ACCEPTED),
            Some(
                "time budget 70s; drain.maxDelay 45s from the load balancer (Service web-nlb: x=45)"
            )
        );
        // Only Accepted says it.
        assert_eq!(message(&r, "Ready"), Some("ready"));
        // Without a balancer the message is left alone.
        let mut r = report();
        note(&mut r, None);
        assert_eq!(message(&r, ACCEPTED), Some("time budget 70s"));
    }
}
