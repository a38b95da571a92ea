//! NetworkPolicies that port takeover silently breaks (pure).
//!
//! The webhook moves a fronted port's *name* onto the sidecar's listener (a
//! new number) and leaves the app its *number* under `kg-<name>`. A policy
//! that admits the app's port by number then admits traffic nobody sends
//! (the Service targets the name, so the sidecar's number), and drops what
//! the Service sends: every request to the pod is refused, and nothing in
//! Kubernetes says why. A policy that names the port, or admits a range or
//! every port, keeps working. The fix is always the same: name the port.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ContainerPort, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::inject::app_port_name;
use kubegrace_sidecar_api::{admin, pod as pod_names};

/// Ingress to an injected pod that a NetworkPolicy admits on the app's old
/// port number but not on the sidecar's listener.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Blocked {
    /// The pods' owner (`ReplicaSet/web-5d4f`) or the pod itself.
    pub owner: String,
    /// The port name the Service targets, now the sidecar's.
    pub port_name: String,
    /// The sidecar's listener number.
    pub sidecar_port: i32,
    /// The app's number, which the policies admit.
    pub app_port: i32,
    /// The policies that admit `app_port` (sorted).
    pub policies: Vec<String>,
}

impl Blocked {
    /// For `kubectl kubegrace check`, conditions and Events: what breaks and
    /// the change that fixes it.
    pub fn explain(&self) -> (String, String) {
        let what = format!(
            "NetworkPolicy {} admits the pods of {} on port {} by number, but port takeover moved {:?} to the sidecar on {}: traffic through the Service is dropped",
            self.policies.join(", "),
            self.owner,
            self.app_port,
            self.port_name,
            self.sidecar_port,
        );
        let fix = format!(
            "in the policy's ingress ports write `port: {}` (the name, which follows the sidecar) instead of `port: {}`",
            self.port_name, self.app_port,
        );
        (what, fix)
    }
}

/// The fronted ports of an injected pod: (name, sidecar number, app number).
fn takeovers(pod: &Pod) -> Vec<(String, i32, i32)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let all = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (sidecar, app): (Vec<_>, Vec<_>) = all.partition(|c| c.name == pod_names::CONTAINER);
    let named = |c: &&ContainerPort| c.name.clone().map(|n| (n, c.container_port));
    let app_ports: Vec<(String, i32)> = app
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| named(&p))
        .collect();
    sidecar
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| named(&p))
        .filter(|(name, _)| name != admin::PORT_NAME)
        .filter_map(|(name, listen)| {
            // The webhook's own renaming: `kg-<name>`, or a numbered variant
            // of it when that name was taken.
            let base = app_port_name(&name, &BTreeSet::new());
            app_ports
                .iter()
                .find(|(n, _)| {
                    *n == base
                        || n.strip_prefix(base.as_str())
                            .is_some_and(|rest| rest.starts_with('-'))
                })
                .map(|(_, number)| (name, listen, *number))
        })
        .collect()
}

/// Whether one `ports` entry of an ingress rule admits TCP to the pod's
/// port `number` (whose pod-side name is `name`, if any).
fn entry_admits(entry: &NetworkPolicyPort, number: i32, name: Option<&str>) -> bool {
    if entry.protocol.as_deref().is_some_and(|p| p != "TCP") {
        return false;
    }
    match &entry.port {
        None => true,
        Some(IntOrString::Int(start)) => match entry.end_port {
            Some(end) => (*start..=end).contains(&number),
            None => *start == number,
        },
        Some(IntOrString::String(port_name)) => name == Some(port_name.as_str()),
    }
}

/// Whether `policy` selects the pod and constrains its ingress.
fn governs_ingress(policy: &NetworkPolicy, pod: &Pod) -> bool {
    let Some(spec) = policy.spec.as_ref() else {
        return false;
    };
    if policy.namespace() != pod.namespace() {
        return false;
    }
    // Unset policyTypes means Ingress (plus Egress when egress rules exist).
    let ingress = spec
        .policy_types
        .as_ref()
        .is_none_or(|types| types.iter().any(|t| t == "Ingress"));
    ingress
        && Selector::try_from(spec.pod_selector.clone().unwrap_or_default())
            .is_ok_and(|s| s.matches(pod.labels()))
}

/// Whether `policy` admits ingress to `number` (named `name` on the pod)
/// from anywhere it admits anything.
fn admits(policy: &NetworkPolicy, number: i32, name: Option<&str>) -> bool {
    policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.as_ref())
        .into_iter()
        .flatten()
        .any(|rule| match rule.ports.as_deref() {
            None | Some([]) => true,
            Some(entries) => entries.iter().any(|e| entry_admits(e, number, name)),
        })
}

fn owner(pod: &Pod) -> String {
    pod.owner_references()
        .first()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .unwrap_or_else(|| format!("Pod/{}", pod.name_any()))
}

/// Takeovers that the policies of the pods' namespace break, one per owner
/// and port (pure). Policies are additive: a port is open when any policy
/// that governs the pod's ingress admits it, and every port is open when
/// none governs it.
pub fn blocked<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    policies: &[NetworkPolicy],
) -> Vec<Blocked> {
    let mut out = BTreeSet::new();
    for pod in pods {
        let governing: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| governs_ingress(p, pod))
            .collect();
        if governing.is_empty() {
            continue;
        }
        for (name, listen, app) in takeovers(pod) {
            let renamed = app_port_name(&name, &BTreeSet::new());
            let sidecar_open = governing.iter().any(|p| admits(p, listen, Some(&name)));
            let by_app_number: Vec<String> = governing
                .iter()
                .filter(|p| admits(p, app, Some(&renamed)) && !admits(p, listen, Some(&name)))
                .map(|p| p.name_any())
                .collect();
            if !sidecar_open && !by_app_number.is_empty() {
                out.insert(Blocked {
                    owner: owner(pod),
                    port_name: name,
                    sidecar_port: listen,
                    app_port: app,
                    policies: by_app_number,
                });
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injected_pod() -> Pod {
        serde_norway::from_str(
            r#"
metadata:
  name: web-5d4f-abcde
  namespace: shop
  labels: {app: web}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f, uid: u1}]
spec:
  initContainers:
  - name: kubegrace-sidecar
    image: s
    restartPolicy: Always
    ports: [{name: http, containerPort: 15181}, {name: kg-admin, containerPort: 15180}]
  containers:
  - name: app
    image: a
    ports: [{name: kg-http, containerPort: 8080}, {name: metrics, containerPort: 9090}]
"#,
        )
        .expect("pod")
    }

    fn policy(name: &str, body: &str) -> NetworkPolicy {
        serde_norway::from_str(&format!(
            "metadata: {{name: {name}, namespace: shop}}\nspec:\n{body}"
        ))
        .expect("policy")
    }

    #[test]
    fn a_policy_admitting_the_app_number_only_is_reported_with_the_fix() {
        let by_number = policy(
            "allow-web",
            "  podSelector: {matchLabels: {app: web}}\n  ingress: [{ports: [{port: 8080}]}]",
        );
        let found = blocked(&[injected_pod()], &[by_number]);
        assert_eq!(
            found,
            vec![Blocked {
                owner: "ReplicaSet/web-5d4f".into(),
                port_name: "http".into(),
                sidecar_port: 15181,
                app_port: 8080,
                policies: vec!["allow-web".into()],
            }]
        );
        let (what, fix) = found[0].explain();
        assert!(what.contains("NetworkPolicy allow-web admits the pods of ReplicaSet/web-5d4f on port 8080 by number"), "{what}");
        assert!(fix.contains("`port: http`"), "{fix}");
    }

    #[test]
    fn named_ranged_open_or_unrelated_policies_are_fine() {
        let pod = injected_pod();
        let fine = [
            // The name follows the sidecar.
            "  podSelector: {}\n  ingress: [{ports: [{port: http}]}]",
            // A range over both numbers.
            "  podSelector: {}\n  ingress: [{ports: [{port: 8000, endPort: 16000}]}]",
            // Every port.
            "  podSelector: {matchLabels: {app: web}}\n  ingress: [{}]",
            // Another app's pods.
            "  podSelector: {matchLabels: {app: db}}\n  ingress: [{ports: [{port: 8080}]}]",
            // Egress only: ingress stays open.
            "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{ports: [{port: 53}]}]",
            // Denies everything: not takeover's doing.
            "  podSelector: {}\n  policyTypes: [Ingress]",
        ];
        for body in fine {
            assert_eq!(
                blocked(std::slice::from_ref(&pod), &[policy("p", body)]),
                vec![],
                "{body}"
            );
        }
        // Additive: a second policy that admits the sidecar's number opens it.
        let by_number = policy(
            "by-number",
            "  podSelector: {}\n  ingress: [{ports: [{port: 8080}]}]",
        );
        let sidecar = policy(
            "sidecar",
            "  podSelector: {}\n  ingress: [{ports: [{port: 15181}]}]",
        );
        assert_eq!(
            blocked(std::slice::from_ref(&pod), &[by_number.clone(), sidecar]),
            vec![]
        );
        // UDP on the number does not count as admitting TCP.
        let udp = policy(
            "udp",
            "  podSelector: {}\n  ingress: [{ports: [{port: 8080, protocol: UDP}]}]",
        );
        assert_eq!(blocked(std::slice::from_ref(&pod), &[udp]), vec![]);
        // Policies of another namespace do not govern the pod.
        let mut elsewhere = by_number;
        elsewhere.metadata.namespace = Some("other".into());
        assert_eq!(blocked(&[pod], &[elsewhere]), vec![]);
    }

    #[test]
    fn pods_of_one_owner_are_reported_once_and_bare_pods_never() {
        let by_number = policy(
            "allow-web",
            "  podSelector: {}\n  ingress: [{ports: [{port: 8080}]}]",
        );
        let mut second = injected_pod();
        second.metadata.name = Some("web-5d4f-fghij".into());
        assert_eq!(
            blocked(&[injected_pod(), second], std::slice::from_ref(&by_number)).len(),
            1
        );
        // A pod without the sidecar has nothing taken over.
        let bare: Pod = serde_norway::from_str(
            "metadata: {name: x, namespace: shop}\nspec: {containers: [{name: app, image: a, ports: [{name: http, containerPort: 8080}]}]}",
        )
        .expect("pod");
        assert_eq!(blocked(&[bare], &[by_number]), vec![]);
    }
}
