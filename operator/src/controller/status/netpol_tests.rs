//! The status step and NetworkPolicies that port takeover breaks.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::*;
use crate::controller::fixtures::{DEPLOYMENT, ROUTE, checked, condition_of, observed, route};
use crate::reasons::{DEGRADED, NETWORK_POLICY_BLOCKS_SIDECAR};

/// An injected pod of `web`: the sidecar has the port name `http` on 15181,
/// the app keeps 8080 as `kg-http`.
const INJECTED: &str = r#"
metadata:
  name: web-1
  namespace: shop
  labels: {app: web, kubegrace.io/inject: enabled}
  annotations: {kubegrace.io/injected: 'true'}
spec:
  terminationGracePeriodSeconds: 60
  containers:
  - {name: app, image: app, ports: [{name: kg-http, containerPort: 8080}]}
  - name: kubegrace-sidecar
    image: sidecar
    ports: [{name: http, containerPort: 15181}, {name: kg-admin, containerPort: 15180}]
"#;

fn policy(port: &str) -> NetworkPolicy {
    serde_norway::from_str(&format!(
        "metadata: {{name: allow-web, namespace: shop}}\nspec: {{podSelector: {{matchLabels: {{app: web}}}}, ingress: [{{ports: [{{port: {port}}}]}}]}}"
    ))
    .expect("policy")
}

fn report_with(policies: Vec<NetworkPolicy>) -> Report {
    let r = route(ROUTE);
    let pod: Pod = serde_norway::from_str(INJECTED).expect("pod");
    let mut seen = observed(&r, &[DEPLOYMENT], &[pod]);
    seen.network_policies = policies;
    let (valid, d) = checked(&r, &seen);
    accepted(&r, &seen, &valid, &d)
}

fn degraded(report: &Report) -> &Condition {
    condition_of(&report.status, DEGRADED)
}

#[test]
fn a_policy_that_admits_the_apps_port_number_degrades_the_route_with_the_fix() {
    let report = report_with(vec![policy("8080")]);
    let c = degraded(&report);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", NETWORK_POLICY_BLOCKS_SIDECAR)
    );
    assert!(c.message.contains("allow-web"), "{}", c.message);
    assert!(c.message.contains("`port: http`"), "{}", c.message);
    assert!(
        report
            .events
            .iter()
            .any(|e| e.reason == NETWORK_POLICY_BLOCKS_SIDECAR),
        "{:?}",
        report.events
    );
}

#[test]
fn a_policy_by_name_or_none_at_all_leaves_the_route_healthy() {
    for policies in [vec![policy("http")], vec![]] {
        let report = report_with(policies);
        assert_eq!(degraded(&report).status, "False", "{:?}", degraded(&report));
    }
}
