//! Services that reach the app directly instead of the sidecar: the
//! route controller and the admission webhook report them, the kubectl
//! plugin's `check` too.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodTemplateSpec, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::crd::GraceRoute;
use crate::workloads::{Target, template_labels};

/// The number of the container port named `name` in a pod template.
pub fn app_port(template: &PodTemplateSpec, name: &str) -> Option<i32> {
    template
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

/// A Service port that reaches the app directly instead of the sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    pub service: String,
    /// Index in `spec.ports` (for the JSON patch in the fix).
    pub index: usize,
    pub port: i32,
    /// The targetPort as written (`8080`, or empty when it defaults to `port`).
    pub target: String,
}

impl Bypass {
    /// The sentence for conditions, Events and admission warnings: what is
    /// wrong, and the exact command that fixes it.
    pub fn explain(&self, port_name: &str) -> String {
        let how = if self.target.is_empty() {
            format!("{} (targetPort unset means the port number)", self.port)
        } else if self.target.parse::<i32>().is_ok() {
            format!("{} by number", self.target)
        } else {
            format!("{} (the app's renamed port)", self.target)
        };
        format!(
            "Service {svc} port {port} targets {how}, which reaches the app directly: its traffic skips the sidecar and is not drained; fix: set targetPort: {port_name} in the Service (kubectl patch service {svc} --type=json -p '[{{\"op\":\"replace\",\"path\":\"/spec/ports/{i}/targetPort\",\"value\":\"{port_name}\"}}]')",
            svc = self.service,
            port = self.port,
            i = self.index,
        )
    }
}

/// The Service ports that select the route's pods and resolve to the app's
/// port instead of the sidecar's listener (pure). Port takeover moves the
/// *name* to the sidecar and keeps the app's *number*, so a `targetPort`
/// that is the number (or unset, which means the number) bypasses the
/// sidecar, as does one naming the app's renamed port (`kg-<name>`).
/// `pods` are the label sets of the route's pods (its targets' templates).
pub fn bypassing_services(
    services: &[Service],
    pods: &[BTreeMap<String, String>],
    port_name: &str,
    app_port: i32,
) -> Vec<Bypass> {
    let renamed = crate::inject::app_port_name(port_name, &Default::default());
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        // A Service without a selector has hand-made endpoints: not ours to judge.
        let Some(sel) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let selects = pods
            .iter()
            .any(|labels| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
        if !selects {
            continue;
        }
        for (index, p) in spec.ports.iter().flatten().enumerate() {
            if p.protocol.as_deref().is_some_and(|pr| pr != "TCP") {
                continue;
            }
            let (bypasses, target) = match &p.target_port {
                None => (p.port == app_port, String::new()),
                Some(IntOrString::Int(n)) => (*n == app_port, n.to_string()),
                Some(IntOrString::String(s)) => (*s == renamed, s.clone()),
            };
            if bypasses {
                out.push(Bypass {
                    service: svc.metadata.name.clone().unwrap_or_default(),
                    index,
                    port: p.port,
                    target,
                });
            }
        }
    }
    out
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
        .filter_map(|(t, _)| app_port(&t.template, &port.name))
        .collect();
    let mut out = Vec::new();
    for n in numbers {
        for b in bypassing_services(services, &labels, &port.name, n) {
            let s = b.explain(&port.name);
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_targeting_the_app_number_bypasses_and_a_named_one_does_not() {
        let svc = |name: &str, target: &str| -> k8s_openapi::api::core::v1::Service {
            serde_norway::from_str(&format!(
                "metadata: {{name: {name}}}\nspec: {{selector: {{app: web}}, ports: [{{port: 80{target}}}]}}"
            ))
            .expect("service")
        };
        let services = vec![
            svc("web-num", ", targetPort: 8080"),
            svc("web-named", ", targetPort: http"),
            svc("web-renamed", ", targetPort: kg-http"),
        ];
        let pods = vec![BTreeMap::from([("app".to_string(), "web".to_string())])];
        let found = bypassing_services(&services, &pods, "http", 8080);
        let names: Vec<&str> = found.iter().map(|b| b.service.as_str()).collect();
        assert_eq!(names, vec!["web-num", "web-renamed"]);
        let msg = found[0].explain("http");
        assert!(
            msg.contains("Service web-num port 80 targets 8080 by number"),
            "{msg}"
        );
        assert!(msg.contains(r#"kubectl patch service web-num --type=json -p '[{"op":"replace","path":"/spec/ports/0/targetPort","value":"http"}]'"#), "{msg}");
        // targetPort unset means the port number: 8080 -> 8080 bypasses.
        let unset: k8s_openapi::api::core::v1::Service = serde_norway::from_str(
            "metadata: {name: u}\nspec: {selector: {app: web}, ports: [{port: 8080}]}",
        )
        .expect("service");
        assert_eq!(bypassing_services(&[unset], &pods, "http", 8080).len(), 1);
        // A Service selecting other pods is not ours.
        let other = vec![BTreeMap::from([("app".to_string(), "db".to_string())])];
        assert!(bypassing_services(&services, &other, "http", 8080).is_empty());
    }
}
