//! Argo Rollouts' `Rollout` (`argoproj.io/v1alpha1`), as far as kubegrace
//! reads it: the pod template, selector and rollout fields a route needs,
//! and the status that says whether a rollout is under way.
//!
//! Only the fields below are decoded (each optional: a missing one is
//! `None`); everything else in the object is dropped on decode. So these
//! types are for reading: every write to a Rollout is a patch naming only
//! its own fields (server-side apply or a merge patch), never a replace of
//! a decoded object, whose `None`s would serialize as nulls.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The Rollout's spec (the part kubegrace reads).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "Rollout",
    namespaced,
    status = "serde_json::Value",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase", default)]
pub struct ArgoRolloutSpec {
    /// Pods wanted (Argo's default: 1).
    pub replicas: Option<i32>,
    /// Selects every revision's pods; Argo adds its hash label per revision.
    pub selector: Option<LabelSelector>,
    /// Absent when the Rollout takes its template from a Deployment
    /// (`workloadRef`), which kubegrace does not follow.
    pub template: Option<PodTemplateSpec>,
    /// As a Deployment's; `rollout.minReadySeconds` writes it.
    pub min_ready_seconds: Option<i32>,
    /// The user-level pause (`kubectl argo rollouts pause`), which the
    /// pause-on-drain-loss decision also sets; absent is false.
    pub paused: bool,
    /// Canary (also when absent) or blue-green.
    pub strategy: Option<ArgoStrategy>,
}

/// `spec.strategy`: exactly one of the two is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ArgoStrategy {
    pub canary: Option<ArgoCanary>,
    /// Blue-green has no surge fields kubegrace writes; only its presence
    /// matters.
    pub blue_green: Option<serde_json::Value>,
}

/// `spec.strategy.canary`: the surge fields, as in a Deployment's
/// `rollingUpdate`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ArgoCanary {
    /// Extra pods during a step (Argo's default: 25%).
    pub max_surge: Option<IntOrString>,
    /// Pods that may be missing during a step (Argo's default: 25%).
    pub max_unavailable: Option<IntOrString>,
}

/// What kubegrace reads of a Rollout's status, which is kept as Argo wrote
/// it (a JSON object): a few fields, read where they are needed.
impl Rollout {
    fn status_field(&self, key: &str) -> Option<&serde_json::Value> {
        self.status.as_ref()?.get(key)
    }

    /// A string field of the status (`phase`, `message`, `currentPodHash`:
    /// the newest revision's pod-template hash, `stableRS`: the stable one's).
    pub fn status_str(&self, key: &str) -> Option<&str> {
        self.status_field(key)?.as_str()
    }

    /// A replica count of the status (`replicas`, `updatedReplicas`,
    /// `availableReplicas`); 0 when absent or out of range.
    pub fn status_count(&self, key: &str) -> i32 {
        let n = self.status_field(key).and_then(serde_json::Value::as_i64);
        n.and_then(|n| i32::try_from(n).ok()).unwrap_or(0)
    }

    /// Argo Rollouts has acted on the newest spec: `status.observedGeneration`
    /// (a string in Argo) has reached `metadata.generation`.
    pub fn seen(&self) -> bool {
        let observed = self.status_str("observedGeneration");
        let observed = observed.and_then(|g| g.parse::<i64>().ok());
        observed.is_some_and(|g| g >= self.metadata.generation.unwrap_or(0))
    }

    /// The newest revision is the stable one: no canary step or blue-green
    /// preview is waiting for promotion.
    pub fn promoted(&self) -> bool {
        let current = self.status_str("currentPodHash");
        current.is_some() && current == self.status_str("stableRS")
    }
}

/// The label Argo Rollouts puts on a Rollout's pods and ReplicaSets (the
/// Deployment controller's is `pod-template-hash`): the ReplicaSet owning
/// a pod is `<rollout>-<hash>`.
pub const POD_TEMPLATE_HASH: &str = "rollouts-pod-template-hash";

/// Ok when Argo Rollouts has acted on the Rollout's spec, the newest revision is the
/// stable one (promoted), every replica is updated and available, and the phase is
/// `Healthy`; else what is missing.
pub fn rolled_out(r: &Rollout) -> Result<(), String> {
    if !r.seen() {
        return Err("Argo Rollouts has not seen the change yet".into());
    }
    let want = r.spec.replicas.unwrap_or(1);
    let phase = r.status_str("phase").unwrap_or("-");
    let promoted = r.promoted();
    let updated = r.status_count("updatedReplicas");
    let available = r.status_count("availableReplicas");
    let total = r.status_count("replicas");
    if phase == "Healthy" && promoted && updated == want && available == want && total == want {
        Ok(())
    } else {
        Err(format!(
            "phase {phase} ({}), promoted {promoted}, {updated} updated, {available} available of {want} ({total} counted)",
            r.status_str("message").unwrap_or("")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout_at_generation_4(status: serde_json::Value) -> Rollout {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "generation": 4},
            "spec": {"replicas": 3, "strategy": {"canary": {}}},
            "status": status,
        }))
        .expect("rollout")
    }

    #[test]
    fn a_rollout_is_rolled_out_only_when_promoted_healthy_and_complete() {
        let done = serde_json::json!({"observedGeneration": "4", "phase": "Healthy", "currentPodHash": "b",
                          "stableRS": "b", "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3});
        assert_eq!(rolled_out(&rollout_at_generation_4(done.clone())), Ok(()));
        for (field, value) in [
            ("observedGeneration", serde_json::json!("3")),
            ("phase", serde_json::json!("Paused")),
            ("stableRS", serde_json::json!("a")),
            ("availableReplicas", serde_json::json!(2)),
            ("replicas", serde_json::json!(4)),
        ] {
            let mut s = done.clone();
            s[field] = value;
            assert!(rolled_out(&rollout_at_generation_4(s)).is_err(), "{field}");
        }
    }

    #[test]
    fn a_rollout_as_argo_writes_it_decodes() {
        let r: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "web", "namespace": "shop", "generation": 3},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "x"}]}},
                "strategy": {"canary": {"maxSurge": "25%", "steps": [{"setWeight": 50}, {"pause": {}}]}},
                "revisionHistoryLimit": 2
            },
            "status": {"observedGeneration": "3", "currentPodHash": "abc", "stableRS": "def", "phase": "Paused", "HPAReplicas": 3}
        }))
        .expect("decodes");
        let canary = r
            .spec
            .strategy
            .clone()
            .and_then(|s| s.canary)
            .expect("canary");
        assert_eq!(canary.max_surge, Some(IntOrString::String("25%".into())));
        assert_eq!(r.status_str("stableRS"), Some("def"));
        assert!(r.seen(), "observedGeneration \"3\" at generation 3");
        assert!(!r.promoted(), "abc is not the stable def");
        assert_eq!(r.status_count("HPAReplicas"), 3);
        let (target, selector) = crate::workloads::rollout_target(&r).expect("target");
        assert_eq!(target.id(), "Rollout/web");
        assert_eq!(
            target.strategy_type.as_deref(),
            Some(crate::workloads::CANARY)
        );
        assert_eq!(
            target.current.max_surge,
            Some(IntOrString::String("25%".into()))
        );
        assert_eq!(selector.as_deref(), Some("app=web"));
    }

    fn rollout(status: serde_json::Value, strategy: serde_json::Value) -> Rollout {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "generation": 2},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}},
                "strategy": strategy
            },
            "status": status
        }))
        .expect("rollout")
    }

    #[test]
    fn a_revision_not_yet_promoted_is_a_rollout_under_way() {
        let done = serde_json::json!({"observedGeneration": "2", "replicas": 2, "updatedReplicas": 2, "currentPodHash": "b", "stableRS": "b"});
        let canary = serde_json::json!({"canary": {}});
        let state =
            |status| crate::pause::rollout_state(&rollout(status, canary.clone())).expect("state");
        assert!(!state(done.clone()).progressing);
        let mut unpromoted = done.clone();
        unpromoted["stableRS"] = "a".into();
        assert!(
            state(unpromoted).progressing,
            "canary at a step or blue-green preview"
        );
        let mut unseen = done.clone();
        unseen["observedGeneration"] = "1".into();
        assert!(state(unseen).progressing, "spec not yet seen by Argo");
        let mut garbage = done;
        garbage["observedGeneration"] = "not a number".into();
        assert!(
            state(garbage).progressing,
            "an unreadable generation is not 'seen'"
        );
        let bg = rollout(
            serde_json::json!({}),
            serde_json::json!({"blueGreen": {"activeService": "web"}}),
        );
        let (target, _) = crate::workloads::rollout_target(&bg).expect("target");
        assert_eq!(
            target.strategy_type.as_deref(),
            Some(crate::workloads::BLUE_GREEN)
        );
    }

    #[test]
    fn a_rollout_that_takes_its_template_from_a_deployment_is_no_target() {
        let r: Rollout = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}
        }))
        .expect("rollout");
        assert!(crate::workloads::rollout_target(&r).is_none());
    }
}
