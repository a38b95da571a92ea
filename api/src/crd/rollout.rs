//! The route's `rollout`: pacing written into the target workload, and the
//! grace period (`auto` or pinned).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use schemars::{Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::bounds::{MAX_GRACE_SECONDS, MAX_MIN_READY_SECONDS, MAX_ROLLOUT_PODS, PERCENT_PATTERN};

pub(super) fn r_grace() -> IntOrString {
    IntOrString::String("auto".into())
}

// Int-or-string values cannot carry typed anyOf branches in a structural
// schema (and `minimum`/`pattern` would each pass the other type), so the
// rules are CEL.
fn int_or_percent(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{
            "rule": format!(
                "type(self) == string ? self.matches('{PERCENT_PATTERN}') : (self >= 0 && self <= {MAX_ROLLOUT_PODS})"
            ),
            "message": format!(
                "must be a number of pods from 0 to {MAX_ROLLOUT_PODS} or a percentage from 0% to 100% without leading zeros, like 25%"
            ),
        }],
    })
}

fn grace_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{
            "rule": format!("type(self) == string ? self == 'auto' : (self >= 1 && self <= {MAX_GRACE_SECONDS})"),
            "message": format!("must be auto or a number of seconds from 1 to {MAX_GRACE_SECONDS}"),
        }],
    })
}

/// Rollout pacing written into the target (Deployment `spec.strategy`,
/// `spec.minReadySeconds`) only for the fields set here: a field left out
/// stays whatever the workload's own manifest says. The grace period is
/// never written into the pod template; the webhook raises it on each pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.maxSurge) || !has(self.maxUnavailable) || !(self.maxSurge == 0 || self.maxSurge == '0%') || !(self.maxUnavailable == 0 || self.maxUnavailable == '0%')").message("maxSurge and maxUnavailable cannot both be 0: the rollout could never progress"))]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Deployments only (StatefulSets have no surge): a number of pods
    /// from 0 to 100000 or a percentage from 0% to 100% (no leading zeros:
    /// `5%`, not `05%`). Unset: not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_percent")]
    pub max_surge: Option<IntOrString>,
    /// Deployments only: a number of pods from 0 to 100000 or a percentage
    /// from 0% to 100% (no leading zeros). Unset: not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_percent")]
    pub max_unavailable: Option<IntOrString>,
    /// Deployments and StatefulSets: seconds a new pod must be ready
    /// before it counts as available, 0 to 3600. Unset: not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_MIN_READY_SECONDS))]
    pub min_ready_seconds: Option<i32>,
    /// `auto` (derived from drain and route timeouts, at most 1h5s) or a
    /// number of seconds from 1 to 86400, which must be at least the
    /// derived budget. Set on each injected pod by the webhook (raised to
    /// it, never lowered), not in the workload. Default: `auto`.
    #[serde(default = "r_grace")]
    #[schemars(schema_with = "grace_schema")]
    pub termination_grace_period_seconds: IntOrString,
    /// Pause a Deployment's rollout (`spec.paused: true`) when a pod it
    /// replaces reports a lossy drain: at least one connection force-closed
    /// at `drain.timeout` (its requests, if any, cut), as counted in
    /// `status.lastDrains`. The route then has a `RolloutPaused` condition
    /// naming the pod and what it lost; fix the cause (raise
    /// `drain.timeout` above the longest request) and resume with `kubectl
    /// kubegrace resume`. StatefulSets have no pause: they get the
    /// condition and Event only. Writes nothing into the workload until a
    /// loss is seen. Default: false.
    #[serde(default)]
    pub pause_on_drain_loss: bool,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_surge: None,
            max_unavailable: None,
            min_ready_seconds: None,
            termination_grace_period_seconds: r_grace(),
            pause_on_drain_loss: false,
        }
    }
}
