//! The objects a run creates: names, the demo app's Deployment and Service, the GraceRoute.

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kubegrace_sidecar_api::keys;
use serde_json::json;

use super::Drain;
use crate::demo_image;

/// Label that scopes this run's webhook to its own namespaces.
pub const RUN_LABEL: &str = "kubegrace.io/e2e-run";
/// The demo app's container port (named `http`; the Service targets the name).
pub const APP_PORT: i32 = 8080;

/// The Deployment (and Service) fronted by kubegrace.
pub const WITH: &str = "demo-with";
/// The Deployment (and Service) without kubegrace.
pub const WITHOUT: &str = "demo-without";

pub fn graceroute_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubegrace.io", "v1alpha1", "GraceRoute"),
        "graceroutes",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// GraceRoute `name` on Deployment `name`, port `http` (protocol http), drain timers
/// `drain`, and `extra` merged over that spec (e.g. `{"routes": [...]}`).
pub fn graceroute(name: &str, drain: &Drain, extra: serde_json::Value) -> Result<DynamicObject> {
    let d = drain;
    let mut spec = json!({
        "targetRef": {"kind": "Deployment", "name": name},
        "ports": [{"name": "http", "protocol": "http"}],
        "drain": {"minDelay": d.min_delay, "quiet": d.quiet, "maxDelay": d.max_delay, "timeout": d.timeout},
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

/// The demo app's container `app`: the local image, port `http` ([`APP_PORT`]), its pod's
/// name from the downward API, ready on `/healthz`, a restricted security context.
pub fn demo_container() -> serde_json::Value {
    json!({
        "name": "app",
        "image": demo_image(),
        "imagePullPolicy": "Never",
        "ports": [{"name": "http", "containerPort": APP_PORT}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]}},
    })
}

/// Deployment `name` of the demo app ([`demo_container`], `replicas` pods), annotated
/// `kubegrace.io/inject=enabled` iff `kubegrace`.
pub fn deployment(name: &str, replicas: i32, kubegrace: bool) -> Result<Deployment> {
    let mut app = demo_container();
    app["resources"] = json!({"requests": {"cpu": "20m", "memory": "16Mi"}});
    let mut d = json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "containers": [app],
                },
            },
        },
    });
    if kubegrace {
        // What a user types: `kubectl annotate deployment demo-with kubegrace.io/inject=enabled`.
        d["metadata"]["annotations"] = json!({ (keys::INJECT): "enabled" });
    }
    Ok(serde_json::from_value(d)?)
}

pub fn service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        // NodePort too, for hosts that do not route ClusterIPs (kind): the same
        // kube-proxy rules, reached on the node's address.
        "spec": {"type": "NodePort", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?)
}
