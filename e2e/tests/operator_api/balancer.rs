//! A route at the default `drain.maxDelay`, behind a cloud load balancer
//! (`operator/src/controller/balancer.rs`): the AWS target group's deregistration delay on a
//! Service selecting the route's pods raises the route's maxDelay (the sidecars' config, the
//! budget, and through the injection webhook the grace period of a pod injected after it),
//! the `Accepted` message says where it came from, and a maxDelay of the route's own (any
//! other value) wins again.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::Api;
use kube::api::ListParams;
use kubegrace_operator::crd::GraceRoute;
use kubegrace_operator::rules::balancer::{
    AWS_DEREGISTRATION_DELAY, AWS_TARGET_GROUP_ATTRIBUTES, GKE_BACKEND_CONFIG,
};
use kubegrace_sidecar_api::config::Config;
use kubegrace_sidecar_api::pod;
use serde_json::json;

use crate::harness::*;

const FROM_BALANCER: &str = "from the load balancer";

/// The maxDelay in route `web`'s ConfigMap.
async fn config_max_delay(client: &kube::Client, ns: &str) -> Option<Duration> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("kubegrace-web")
        .await
        .ok()?;
    let yaml = cm.data.as_ref()?.get(pod::CONFIG_FILE)?;
    let config: Config = serde_norway::from_str(yaml).ok()?;
    Some(config.drain.max_delay.get())
}

#[tokio::test]
async fn a_load_balancers_drain_time_raises_a_routes_default_max_delay() {
    let test = "a_load_balancers_drain_time_raises_a_routes_default_max_delay";
    in_cluster(test, "kg-lb", false, async |client, ns| {
        let port = free_port();
        webhook_config(client, &ns.name, port, "Fail").await;
        let operator = start_operator(client, &ns.name, port);
        wait_ca_bundle(client, &ns.name).await;

        create_serving_web_deployment(client, &ns.name).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        wait_for(90, "a pod of web", || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
            (!list.items.is_empty()).then_some(())
        })
        .await;
        // What the aws-load-balancer-controller reads for an NLB in IP mode.
        let nlb: Service = serde_json::from_value(json!({
            "metadata": {"name": "web-nlb", "annotations": {
                AWS_TARGET_GROUP_ATTRIBUTES:
                    format!("stickiness.enabled=false,{AWS_DEREGISTRATION_DELAY}=45"),
            }},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
        }))
        .expect("service");
        create(&Api::namespaced(client.clone(), &ns.name), &nlb, "create service").await;
        // A GKE one whose BackendConfig is not there (no such CRD on this cluster: the API
        // server answers 404 for the whole type): not followed, and no failed reconcile.
        let neg: Service = serde_json::from_value(json!({
            "metadata": {"name": "web-neg", "annotations": {
                GKE_BACKEND_CONFIG: r#"{"default": "missing"}"#,
            }},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
        }))
        .expect("service");
        create(&Api::namespaced(client.clone(), &ns.name), &neg, "create service").await;

        // No maxDelay written (the API server fills in the default 15s): raised to the
        // balancer's 45s, and the budget follows (45s + 20s + 5s).
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        let spec = json!({
            "targetRef": {"kind": "Deployment", "name": "web"},
            "ports": [{"name": "http"}],
            "drain": {"timeout": "20s"},
        });
        let route = graceroute_spec(
            "web",
            spec,
        );
        create(&routes, &route, "create route").await;
        let r = wait_for(60, "budget 70s from the balancer's 45s", || async {
            let r = routes.get("web").await.ok()?;
            (r.status.as_ref()?.budget_seconds == Some(70)).then_some(r)
        })
        .await;
        let (accepted, _, msg) = condition(&r, "Accepted").expect("Accepted");
        assert_eq!(accepted, "True", "{msg}");
        assert!(
            msg.contains(&format!(
                "drain.maxDelay 45s {FROM_BALANCER} (Service web-nlb: {AWS_TARGET_GROUP_ATTRIBUTES} {AWS_DEREGISTRATION_DELAY}=45)"
            )),
            "{msg}"
        );
        let in_config = wait_for(30, "maxDelay 45s in the sidecars' config", || async {
            config_max_delay(client, &ns.name)
                .await
                .filter(|d| *d == Duration::from_secs(45))
        })
        .await;
        assert_eq!(in_config, Duration::from_secs(45));

        // A pod injected now gets the raised budget as its grace period: the webhook takes
        // the status's budget when it is longer than the spec's (40s).
        annotate_inject(&Api::namespaced(client.clone(), &ns.name), "web").await;
        let grace = wait_for(90, "an injected pod of web", || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
            list.items
                .iter()
                .find(|p| has_sidecar(p))
                .and_then(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        })
        .await;
        assert_eq!(grace, 70, "the injected pod's grace period");

        // A maxDelay the route writes is the route's, even below the balancer's.
        patch_route_spec(&routes, "web", json!({"drain": {"maxDelay": "10s"}}))
            .await
            .expect("patch route");
        let r = wait_for(60, "budget 35s from the route's own 10s", || async {
            let r = routes.get("web").await.ok()?;
            (r.status.as_ref()?.budget_seconds == Some(35)).then_some(r)
        })
        .await;
        let (_, _, msg) = condition(&r, "Accepted").expect("Accepted");
        assert!(!msg.contains(FROM_BALANCER), "{msg}");
        wait_for(30, "maxDelay 10s in the sidecars' config", || async {
            config_max_delay(client, &ns.name)
                .await
                .filter(|d| *d == Duration::from_secs(10))
        })
        .await;

        delete_route(&routes, "web").await;
        stop_operator(operator).await;
    })
    .await;
}
