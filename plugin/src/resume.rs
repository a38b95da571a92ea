//! `kubectl kubegrace resume ROUTE`: resumes the rollouts the operator paused for a lossy
//! drain (`rollout.pauseOnDrainLoss`). First the route's `kubegrace.io/resumed-at`
//! annotation gets the time, so the operator holds no drain that ended before it against
//! the rollout again; then each Deployment of the route that the operator paused (its
//! `spec.paused` written by the operator's pause field manager) gets `spec.paused: false`.
//! A Deployment someone else paused is left alone and named: its pause is not kubegrace's.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DynamicObject, ListParams, Patch};
use kube::{Api, Client};
use kubegrace_api::argo::Rollout;
use kubegrace_api::crd::{GraceRoute, TargetKind};
use kubegrace_api::pause::{self, RESUMED_AT};
use kubegrace_api::workloads::Workloads;
use serde_json::json;

use crate::{Error, Result};

/// What resume does to the route's Deployments and Argo Rollouts (pure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Paused by the operator: unpaused.
    pub resume: Vec<(TargetKind, String)>,
    /// Paused by someone else: left alone.
    pub foreign: Vec<(TargetKind, String)>,
}

/// The route's Deployments and Rollouts that are paused, split by who
/// paused them.
pub fn plan(route: &GraceRoute, deployments: &[Deployment], rollouts: &[Rollout]) -> Plan {
    let targets: Vec<String> = Workloads::from_all(deployments, &[], rollouts)
        .of(route)
        .into_iter()
        .map(|(t, _)| t.id())
        .collect();
    let mut plan = Plan::default();
    for (id, state) in pause::states(deployments, &[], rollouts) {
        if !targets.contains(&id) {
            continue;
        }
        match (state.paused, state.paused_here) {
            (true, true) => plan.resume.push((state.kind, state.name)),
            (true, false) => plan.foreign.push((state.kind, state.name)),
            (false, _) => {}
        }
    }
    plan
}

/// `kubectl` resource name and the command that resumes a pause of someone
/// else's.
fn resource(kind: TargetKind, name: &str) -> (&'static str, String) {
    match kind {
        TargetKind::Rollout => ("rollout", format!("kubectl argo rollouts resume {name}")),
        TargetKind::Deployment | TargetKind::StatefulSet => (
            "deployment",
            format!("kubectl rollout resume deploy/{name}"),
        ),
    }
}

/// What happened, one line per workload.
pub fn describe(ns: &str, route: &str, plan: &Plan) -> String {
    let mut lines = Vec::new();
    if plan.resume.is_empty() {
        lines.push(format!(
            "graceroute {ns}/{route}: no Deployment or Rollout paused by kubegrace; resume time recorded"
        ));
    }
    for (kind, d) in &plan.resume {
        lines.push(format!("{} {ns}/{d} resumed", resource(*kind, d).0));
    }
    for (kind, d) in &plan.foreign {
        let (res, command) = resource(*kind, d);
        lines.push(format!(
            "{res} {ns}/{d} left paused: paused by someone else ({command} if you mean it)"
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
    let rollouts = rollouts(client, ns, &route).await?;
    let plan = plan(&route, &deployments.items, &rollouts);
    // The time first: the operator reconciles on the workload's change and
    // must already see it.
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
    for (kind, d) in &plan.resume {
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &kind.api_resource())
            .patch(d, &pp, &pause::paused_patch(false))
            .await
            .map_err(Error::kube(format!("resuming {kind} {ns}/{d}")))?;
    }
    Ok(plan)
}

/// The namespace's Argo Rollouts, read only for a route that can target
/// one; none where Argo Rollouts is not installed (404) or the user may
/// not read Rollouts (403) and the route selects by labels (a route on a
/// Rollout says the 403). `status` shares it.
pub(crate) async fn rollouts(
    client: &Client,
    ns: &str,
    route: &GraceRoute,
) -> Result<Vec<Rollout>> {
    let by_ref = route.spec.target_ref.as_ref();
    if by_ref.is_some_and(|t| t.kind != TargetKind::Rollout) {
        return Ok(Vec::new());
    }
    match Api::<Rollout>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 || (e.code == 403 && by_ref.is_none()) => {
            Ok(Vec::new())
        }
        Err(e) => Err(Error::kube(format!("listing Argo Rollouts in {ns}"))(e)),
    }
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
            plan(&route(), &[ours, other.clone()], &[]),
            Plan {
                resume: vec![(TargetKind::Deployment, "web".into())],
                foreign: vec![],
            }
        );
        assert_eq!(
            plan(&route(), &[theirs, other.clone()], &[]),
            Plan {
                resume: vec![],
                foreign: vec![(TargetKind::Deployment, "web".into())],
            }
        );
        assert_eq!(plan(&route(), &[running, other], &[]), Plan::default());
    }

    #[test]
    fn a_rollout_the_operator_paused_is_resumed_with_its_own_kind() {
        let yaml = route_yaml().replace(
            "targetRef: {kind: Deployment,",
            "targetRef: {group: argoproj.io, kind: Rollout,",
        );
        assert!(yaml.contains("kind: Rollout"), "fixture changed: {yaml}");
        let route: GraceRoute = serde_norway::from_str(&yaml).expect("route fixture");
        let rollout = |manager: &str| -> Rollout {
            serde_json::from_value(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                "metadata": {"name": "web", "namespace": "shop", "managedFields": [{
                    "manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:paused": {}}}
                }]},
                "spec": {
                    "paused": true,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}},
                    "strategy": {"canary": {}}
                }
            }))
            .expect("rollout fixture")
        };
        // A Deployment of the same name is not the route's target.
        let deployment = deployment("web", true, PAUSE_FIELD_MANAGER);
        let ours = plan(
            &route,
            std::slice::from_ref(&deployment),
            &[rollout(PAUSE_FIELD_MANAGER)],
        );
        assert_eq!(ours.resume, vec![(TargetKind::Rollout, "web".into())]);
        let theirs = plan(&route, &[deployment], &[rollout("argo-rollouts")]);
        assert_eq!(theirs.foreign, vec![(TargetKind::Rollout, "web".into())]);
        assert!(describe("shop", "web", &theirs).contains("kubectl argo rollouts resume web"));
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
                resume: vec![(TargetKind::Deployment, "web".into())],
                foreign: vec![(TargetKind::Deployment, "api".into())],
            },
        );
        assert_eq!(
            text,
            "deployment shop/web resumed\ndeployment shop/api left paused: paused by someone else (kubectl rollout resume deploy/api if you mean it)\n"
        );
        assert!(
            describe("shop", "web", &Plan::default()).contains("no Deployment or Rollout paused")
        );
    }
}
