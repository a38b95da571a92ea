//! What a route fronts: the workload (`targetRef`) and its named port
//! (`ports`).

use std::fmt;

use kube::KubeSchema;
use kube::core::{ApiResource, GroupVersionKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::{
    ARGO_GROUP, DNS_LABEL_PATTERN, MAX_GROUP, MAX_PORT_NAME, MAX_TARGET_NAME, SUPPORTED_GROUP,
};

fn t_group() -> String {
    SUPPORTED_GROUP.into()
}

/// The rule on `targetRef` as a whole: each kind lives in one API group.
/// On the struct, not the field, because the group a value must have
/// depends on the kind (a missing group defaults to `apps` first).
fn group_rule() -> String {
    format!(
        "self.kind == 'Rollout' ? self.group == '{ARGO_GROUP}' : self.group == '{SUPPORTED_GROUP}'"
    )
}

fn group_message() -> String {
    format!(
        "targetRef.group must be {SUPPORTED_GROUP} (or left out) for a Deployment or StatefulSet, and {ARGO_GROUP} for an Argo Rollouts Rollout: kubegrace supports Deployment and StatefulSet in the {SUPPORTED_GROUP} API group and Rollout in {ARGO_GROUP}"
    )
}

/// The workload whose pods get the sidecar. Set this or `selector`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(group_rule()).message(Message::Message(group_message())).field_path(".group"))]
pub struct TargetRef {
    /// The workload's API group. Default: `apps`, the group of Deployment
    /// and StatefulSet; an Argo Rollouts `Rollout` needs `argoproj.io`. Any
    /// other pairing is refused with the list of supported kinds. At most
    /// 253 characters.
    #[serde(default = "t_group")]
    #[schemars(length(max = MAX_GROUP))]
    pub group: String,
    /// The workload's kind: `Deployment`, `StatefulSet` or `Rollout` (Argo
    /// Rollouts, group `argoproj.io`). No default.
    pub kind: TargetKind,
    /// The workload's name, in the route's namespace: 1 to 253
    /// characters. No default.
    #[schemars(length(min = 1, max = MAX_TARGET_NAME))]
    pub name: String,
}

impl TargetRef {
    /// `Some(why)` when the group is not the kind's (an object stored under
    /// an older, looser schema).
    pub fn unsupported_group(&self) -> Option<String> {
        (self.group != self.kind.group()).then(group_message)
    }
}

/// A workload kind a route can target.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum TargetKind {
    Deployment,
    StatefulSet,
    /// Argo Rollouts' `Rollout` (`argoproj.io/v1alpha1`), canary or
    /// blue-green; its pods are owned by ReplicaSets like a Deployment's.
    Rollout,
}

impl TargetKind {
    /// The kind's API group, version and resource (plural).
    fn gvr(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Deployment => (SUPPORTED_GROUP, "v1", "deployments"),
            Self::StatefulSet => (SUPPORTED_GROUP, "v1", "statefulsets"),
            Self::Rollout => (ARGO_GROUP, "v1alpha1", "rollouts"),
        }
    }

    /// The API group the kind lives in.
    pub fn group(self) -> &'static str {
        self.gvr().0
    }

    /// `apiVersion` of the kind's objects, for apply bodies.
    pub fn api_version(self) -> String {
        let (group, version, _) = self.gvr();
        format!("{group}/{version}")
    }

    /// The kind's API resource, for the writes that are the same for every
    /// kind (a merge patch of `spec.paused` or of the pod template) through
    /// an untyped `Api<DynamicObject>`.
    pub fn api_resource(self) -> ApiResource {
        let (group, version, plural) = self.gvr();
        let gvk = GroupVersionKind::gvk(group, version, &self.to_string());
        ApiResource::from_gvk_with_plural(&gvk, plural)
    }
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::Rollout => "Rollout",
        })
    }
}

/// A pod port the sidecar takes over.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    /// Name of a container port of the target's pods (an IANA service
    /// name: 1 to 15 lowercase letters, digits and dashes). The key of
    /// the `ports` list. No default.
    #[schemars(
        length(min = 1, max = MAX_PORT_NAME),
        regex(pattern = DNS_LABEL_PATTERN)
    )]
    pub name: String,
    /// What the port speaks: `http` (HTTP/1.1, and HTTP/2 prior knowledge
    /// detected), `http2`, `grpc` or `tcp` (bytes relayed, drained by
    /// connection). Default: `http`.
    #[serde(default)]
    pub protocol: PortProtocol,
}

/// The sidecar's listener protocol.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PortProtocol {
    /// HTTP/1.1; HTTP/2 prior knowledge (h2c) is detected too.
    #[default]
    Http,
    Http2,
    Grpc,
    Tcp,
}
