//! Test fixtures for the crates whose unit tests take GraceRoutes: this
//! crate's, the operator's and the plugin's. Built for tests only (this
//! crate's own, and the `testing` feature the others turn on as a
//! dev-dependency), never into a release binary.

use kube::core::DynamicObject;
use serde_json::{Value, json};

/// The smallest valid route, `shop/web` on Deployment `web` port `http`, as
/// YAML; tests append spec keys indented by two spaces.
pub const ROUTE_YAML: &str = r#"
apiVersion: kubegrace.io/v1alpha1
kind: GraceRoute
metadata: {name: web, namespace: shop}
spec:
  targetRef: {kind: Deployment, name: web}
  ports: [{name: http}]
"#;

/// A route as a watch or list hands it over, undecoded: `shop/NAME` with
/// this `spec` and an empty status.
pub fn route_object(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}"),
                     "resourceVersion": "1", "generation": 2},
        "spec": spec,
        "status": {},
    }))
    .expect("a GraceRoute object")
}

/// A route that decodes: Deployment NAME, port `http`.
pub fn decodable_route(name: &str) -> DynamicObject {
    route_object(name, target_spec(name))
}

/// A route the typed API cannot decode: a circuit breaker threshold past
/// `u32` (the API server stores what an old CRD schema let through).
pub fn undecodable_route(name: &str) -> DynamicObject {
    let mut spec = target_spec(name);
    spec["circuitBreaker"] = json!({"consecutiveFailures": 4_294_967_296_u64});
    route_object(name, spec)
}

fn target_spec(name: &str) -> Value {
    json!({"targetRef": {"kind": "Deployment", "name": name}, "ports": [{"name": "http"}]})
}
