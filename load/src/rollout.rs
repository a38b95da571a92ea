//! A rollout as the loadgen's callers start and judge it: `kubectl rollout restart`'s
//! patch, and whether a Deployment is rolled out.

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

/// The merge patch of `kubectl rollout restart` at `at_unix_s`: a new pod template, so
/// every pod is replaced.
pub fn restart_patch(at_unix_s: f64) -> serde_json::Value {
    json!({"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": format!("{at_unix_s:.3}"),
    }}}}})
}

/// Ok when the Deployment's controller has seen its spec and every replica is updated,
/// ready and available, with no extra pod counted.
pub fn rolled_out(d: &Deployment) -> Result<(), String> {
    let generation = d.metadata.generation.unwrap_or(0);
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    if s.observed_generation.unwrap_or(0) < generation {
        return Err("the Deployment controller has not seen the change yet".into());
    }
    let updated = s.updated_replicas.unwrap_or(0);
    let ready = s.ready_replicas.unwrap_or(0);
    let available = s.available_replicas.unwrap_or(0);
    let total = s.replicas.unwrap_or(0);
    if updated == want && ready == want && available == want && total == want {
        Ok(())
    } else {
        Err(format!(
            "{updated} updated, {ready} ready, {available} available of {want} ({total} counted)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, status: &str) -> Deployment {
        serde_json::from_str(&format!(
            r#"{{"metadata":{{"generation":{generation}}},"spec":{{"replicas":2,"selector":{{}},"template":{{}}}},"status":{status}}}"#
        ))
        .expect("deployment")
    }

    #[test]
    fn rolled_out_needs_the_new_generation_seen_and_every_replica_updated() {
        let done = r#"{"observedGeneration":3,"replicas":2,"updatedReplicas":2,"readyReplicas":2,"availableReplicas":2}"#;
        assert!(rolled_out(&deployment(3, done)).is_ok());
        assert!(rolled_out(&deployment(4, done)).is_err());
        let surging = r#"{"observedGeneration":3,"replicas":3,"updatedReplicas":2,"readyReplicas":3,"availableReplicas":3}"#;
        assert!(rolled_out(&deployment(3, surging)).is_err());
    }
}
