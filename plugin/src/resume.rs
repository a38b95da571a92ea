//! `kubectl kubegrace resume ROUTE`: resumes the rollouts the operator paused for a lossy
//! drain (`rollout.pauseOnDrainLoss`). First the route's `kubegrace.io/resumed-at`
//! annotation gets the time, so the operator holds no drain that ended before it against
//! the rollout again; then each Deployment of the route that the operator paused (its
//! `spec.paused` written by the operator's pause field manager) gets `spec.paused: false`.
//! A Deployment someone else paused is left alone and named: its pause is not kubegrace's.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, Patch};
use kube::{Api, Client, ResourceExt};
use kubegrace_api::crd::GraceRoute;
use kubegrace_api::pause::{self, RESUMED_AT};
use kubegrace_api::workloads::Workloads;
use serde_json::json;

use crate::{Error, Result};

/// What resume does to the route's Deployments (pure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Paused by the operator: unpaused.
    pub resume: Vec<String>,
    /// Paused by someone else: left alone.
    pub foreign: Vec<String>,
}

/// The route's Deployments that are paused, split by who paused them.
pub fn plan(route: &GraceRoute, deployments: &[Deployment]) -> Plan {
    let workloads = Workloads::from_objects(deployments, &[]);
    let targets: Vec<&str> = workloads
        .of(route)
        .into_iter()
        .map(|(t, _)| t.name.as_str())
        .collect();
    let mut plan = Plan::default();
    for d in deployments.iter().filter(|d| {
        let name = d.name_any();
        targets.contains(&name.as_str())
    }) {
        let Some(state) = pause::deployment_state(d) else {
            continue;
        };
        match (state.paused, state.paused_here) {
            (true, true) => plan.resume.push(state.name),
            (true, false) => plan.foreign.push(state.name),
            (false, _) => {}
        }
    }
    plan
}

/// What happened, one line per Deployment.
pub fn describe(ns: &str, route: &str, plan: &Plan) -> String {
    let mut lines = Vec::new();
    if plan.resume.is_empty() {
        lines.push(format!(
            "graceroute {ns}/{route}: no Deployment paused by kubegrace; resume time recorded"
        ));
    }
    for d in &plan.resume {
        lines.push(format!("deployment {ns}/{d} resumed"));
    }
    for d in &plan.foreign {
        lines.push(format!(
            "deployment {ns}/{d} left paused: paused by someone else (kubectl rollout resume deploy/{d} if you mean it)"
        ));
    }
    lines.join("\n") + "\n"
}

/// Records the resume time on the route, then unpauses what the operator paused.
pub async fn resume(client: &Client, ns: &str, name: &str) -> Result<Plan> {
    let routes = crate::cluster::routes(client, Some(ns));
    let obj = crate::cluster::get(&routes, "GraceRoute", ns, name).await?;
    let route = kubegrace_api::tolerant::decode(&obj).map_err(|u| Error::Invalid(u.message()))?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing Deployments in {ns}")))?;
    let plan = plan(&route, &deployments.items);
    // The time first: the operator reconciles on the Deployment's change and must
    // already see it.
    let pp = pause::pause_params();
    let now = jiff::Timestamp::now().to_string();
    routes
        .patch(
            name,
            &pp,
            &Patch::Merge(json!({"metadata": {"annotations": {RESUMED_AT: now}}})),
        )
        .await
        .map_err(Error::kube(format!("annotating GraceRoute {ns}/{name}")))?;
    for d in &plan.resume {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .patch(d, &pp, &pause::paused_patch(false))
            .await
            .map_err(Error::kube(format!("resuming Deployment {ns}/{d}")))?;
    }
    Ok(plan)
}

/// The route's `RolloutPaused` condition in one line, for `status`.
pub fn pause_line(route: &GraceRoute) -> Option<String> {
    let c = route.condition(pause::ROLLOUT_PAUSED)?;
    let state = if c.status == "True" {
        "rollout paused"
    } else {
        "rollout not paused"
    };
    Some(format!("{state} ({}): {}", c.reason, c.message))
}

#[cfg(test)]
mod tests {
    use kubegrace_api::pause::PAUSE_FIELD_MANAGER;

    use super::*;

    /// A route that opted in to pausing.
    fn route_yaml() -> String {
        format!(
            "{}  rollout: {{pauseOnDrainLoss: true}}\n",
            kubegrace_api::fixtures::ROUTE_YAML
        )
    }

    fn deployment(name: &str, paused: bool, manager: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "managedFields": [{
                "manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:paused": {}}}
            }]},
            "spec": {
                "paused": paused,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}}
            }
        }))
        .expect("deployment fixture")
    }

    fn route() -> GraceRoute {
        serde_norway::from_str(&route_yaml()).expect("route fixture")
    }

    #[test]
    fn only_the_targets_pause_that_kubegrace_wrote_is_resumed() {
        let ours = deployment("web", true, PAUSE_FIELD_MANAGER);
        let theirs = deployment("web", true, "kubectl-rollout");
        let running = deployment("web", false, PAUSE_FIELD_MANAGER);
        let other = deployment("api", true, PAUSE_FIELD_MANAGER);
        assert_eq!(
            plan(&route(), &[ours, other.clone()]),
            Plan {
                resume: vec!["web".into()],
                foreign: vec![],
            }
        );
        assert_eq!(
            plan(&route(), &[theirs, other.clone()]),
            Plan {
                resume: vec![],
                foreign: vec!["web".into()],
            }
        );
        assert_eq!(plan(&route(), &[running, other]), Plan::default());
    }

    #[test]
    fn the_pause_reason_is_one_line_of_status() {
        let mut r = route();
        assert_eq!(pause_line(&r), None);
        r.status = Some(kubegrace_api::crd::GraceRouteStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: pause::ROLLOUT_PAUSED.into(),
                status: "True".into(),
                reason: pause::DRAIN_LOSS.into(),
                message: "Deployment/web paused: pod web-a cut 1 requests".into(),
                observed_generation: None,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::UNIX_EPOCH,
                ),
            }],
            ..Default::default()
        });
        assert_eq!(
            pause_line(&r).as_deref(),
            Some("rollout paused (DrainLoss): Deployment/web paused: pod web-a cut 1 requests")
        );
    }

    #[test]
    fn resume_says_what_it_did_and_what_it_left() {
        let text = describe(
            "shop",
            "web",
            &Plan {
                resume: vec!["web".into()],
                foreign: vec!["api".into()],
            },
        );
        assert_eq!(
            text,
            "deployment shop/web resumed\ndeployment shop/api left paused: paused by someone else (kubectl rollout resume deploy/api if you mean it)\n"
        );
        assert!(describe("shop", "web", &Plan::default()).contains("no Deployment paused"));
    }
}
