//! The `GraceRoute` status: what the operator found and did.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::GraceRoute;

/// What the operator found and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GraceRouteStatus {
    /// The route's `metadata.generation` this status describes: behind
    /// it, the operator has not yet reconciled the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (the spec is valid against its targets), `Ready` (every
    /// pod that should carry the sidecar does, with the config in force),
    /// `Degraded` (something bypasses or weakens the sidecar) and, with
    /// `rollout.pauseOnDrainLoss`, `RolloutPaused` (which pod's drain lost
    /// what, and whether the rollout is paused or was resumed), each with a
    /// reason and a message saying what to fix. Keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Workloads this route applies to, as `Kind/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// How many workloads this route applies to (the length of
    /// `targets`). Default: 0.
    #[serde(default)]
    pub target_count: i32,
    /// Pods carrying the sidecar. Default: 0.
    #[serde(default)]
    pub pods_injected: i32,
    /// Pods that should carry the sidecar (their workload opted in).
    /// Default: 0.
    #[serde(default)]
    pub pods_expected: i32,
    /// `injected/expected`, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<String>,
    /// terminationGracePeriodSeconds in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_seconds: Option<i64>,
    /// The budget in seconds with unit, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// The name of the sidecar ConfigMap this route renders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
    /// The sha256 of that ConfigMap's `config.yaml`: it changes exactly
    /// when the sidecars' configuration does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// The drain reports of the pods the last rollout (or scale-down)
    /// replaced, read from their sidecars' termination messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drains: Option<LastDrains>,
}

/// Totals of the drain reports of one rollout: the pods of one pod-template
/// revision that went away. A report from a pod of another revision starts
/// the next totals.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastDrains {
    /// The pod-template hash (`pod-template-hash`,
    /// `controller-revision-hash` or Argo Rollouts'
    /// `rollouts-pod-template-hash`) of the drained pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Pods whose drain report was counted.
    pub pods: i32,
    /// ... of which nothing was closed by force.
    pub clean: i32,
    /// ... of which a connection was still open at drain.timeout and closed.
    pub force_closed: i32,
    /// Requests cut by those force-closes.
    pub requests_cut: i64,
    /// When the latest report was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// `3/3 clean` or `1/3 force-closed`, for the printer column.
    pub summary: String,
    /// UIDs of the counted pods, so a pod is counted once even across
    /// operator restarts (bounded; the oldest are dropped first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_uids: Vec<String>,
}

impl GraceRoute {
    /// The condition of this type, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}
