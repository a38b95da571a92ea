//! The target workload's rollout fields: what the route writes into it,
//! what it was before, and the patch that puts that back.

use serde_json::{Value, json};

use crate::crd::{RolloutSpec, TargetKind};
use crate::keys;

use kubegrace_api::workloads::{BLUE_GREEN, CANARY};
pub use kubegrace_api::workloads::{Originals, Target};

/// Where a kind keeps maxSurge and maxUnavailable under `spec.strategy`:
/// a Deployment's `rollingUpdate`, a canary Rollout's `canary`.
fn surge_block(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Rollout => "canary",
        TargetKind::Deployment | TargetKind::StatefulSet => "rollingUpdate",
    }
}

/// The server-side apply body for the target: only the rollout fields the
/// route's explicit `rollout` block sets, nothing else (fields left out are
/// not ours, and stay what the user's manifest says). Never the pod
/// template: the grace period is raised per pod by the webhook, so neither
/// a budget change nor a GitOps re-apply rolls the pods. `None` when there
/// is nothing to write. Also returns notes on what could not be applied.
pub fn target_apply(
    rollout: Option<&RolloutSpec>,
    target: &Target,
) -> (Option<Value>, Vec<String>) {
    let mut notes = Vec::new();
    let mut spec = serde_json::Map::new();
    // What we are about to own, with the value it has before we do.
    let mut record: Originals = target
        .recorded
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default();
    let fresh = target.recorded.is_none();
    if let Some(r) = rollout {
        if let Some(m) = r.min_ready_seconds {
            spec.insert("minReadySeconds".into(), json!(m));
            if fresh || record.min_ready_seconds.is_none() {
                record.min_ready_seconds = target.current.min_ready_seconds;
            }
        }
        let surge_fields = r.max_surge.is_some() || r.max_unavailable.is_some();
        match (target.kind, target.strategy_type.as_deref()) {
            (_, _) if !surge_fields => {}
            (TargetKind::Deployment, Some("Recreate")) => {
                notes.push(format!(
                    "{} uses the Recreate strategy: maxSurge and maxUnavailable not applied",
                    target.id()
                ));
            }
            (TargetKind::Rollout, Some(BLUE_GREEN)) => {
                notes.push(format!(
                    "{} uses the blue-green strategy (a full preview set, then one switch): maxSurge and maxUnavailable not applied",
                    target.id()
                ));
            }
            (TargetKind::Deployment | TargetKind::Rollout, _) => {
                let mut ru = serde_json::Map::new();
                if let Some(v) = &r.max_surge {
                    ru.insert("maxSurge".into(), json!(v));
                    if fresh || record.max_surge.is_none() {
                        record.max_surge = target.current.max_surge.clone();
                    }
                }
                if let Some(v) = &r.max_unavailable {
                    ru.insert("maxUnavailable".into(), json!(v));
                    if fresh || record.max_unavailable.is_none() {
                        record.max_unavailable = target.current.max_unavailable.clone();
                    }
                }
                spec.insert("strategy".into(), json!({surge_block(target.kind): ru}));
            }
            (TargetKind::StatefulSet, _) => {
                // StatefulSets roll one pod at a time; maxUnavailable there is
                // still behind a feature gate.
                notes.push(format!(
                    "{} is a StatefulSet: maxSurge/maxUnavailable do not apply",
                    target.id()
                ));
            }
        }
    }
    if record == Originals::default() && spec.is_empty() {
        return (None, notes);
    }
    let original = serde_json::to_string(&record).unwrap_or_else(|_| "{}".into());
    let mut body = json!({
        "apiVersion": target.kind.api_version(),
        "kind": target.kind.to_string(),
        "metadata": {
            "name": target.name,
            "annotations": {keys::ORIGINAL: original},
        },
    });
    if !spec.is_empty() {
        body["spec"] = Value::Object(spec);
    }
    (Some(body), notes)
}

/// The merge patch restoring what a route changed: the recorded originals,
/// in one write so the pods roll at most once. The pod template is only
/// touched where an earlier operator version wrote into it (a route pin or
/// a grace period in the record); otherwise it is left exactly as it is.
pub fn restore_patch(target: &Target) -> Option<Value> {
    let recorded = target.recorded.as_deref()?;
    let original: Originals = serde_json::from_str(recorded).unwrap_or_default();
    let mut template = serde_json::Map::new();
    if let Some(t) = original.termination_grace_period_seconds {
        template.insert("spec".into(), json!({"terminationGracePeriodSeconds": t}));
    }
    if target.pinned_route().is_some() {
        template.insert(
            "metadata".into(),
            json!({"annotations": {keys::ROUTE: null}}),
        );
    }
    let mut spec = serde_json::Map::new();
    if !template.is_empty() {
        spec.insert("template".into(), Value::Object(template));
    }
    if let Some(m) = original.min_ready_seconds {
        spec.insert("minReadySeconds".into(), json!(m));
    }
    let surges = match target.kind {
        TargetKind::Deployment => target.strategy_type.as_deref() != Some("Recreate"),
        TargetKind::Rollout => target.strategy_type.as_deref() == Some(CANARY),
        TargetKind::StatefulSet => false,
    };
    if surges {
        let mut ru = serde_json::Map::new();
        if let Some(v) = &original.max_surge {
            ru.insert("maxSurge".into(), json!(v));
        }
        if let Some(v) = &original.max_unavailable {
            ru.insert("maxUnavailable".into(), json!(v));
        }
        if !ru.is_empty() {
            spec.insert("strategy".into(), json!({surge_block(target.kind): ru}));
        }
    }
    Some(json!({"metadata": {"annotations": {keys::ORIGINAL: null}}, "spec": spec}))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::super::testing::{BASE, route, template};
    use super::*;

    fn target(strategy: Option<&str>, recorded: Option<&str>) -> Target {
        Target {
            kind: TargetKind::Deployment,
            name: "web".into(),
            template: PodTemplateSpec::default(),
            strategy_type: strategy.map(Into::into),
            current: Originals {
                max_surge: Some(IntOrString::String("25%".into())),
                max_unavailable: Some(IntOrString::String("25%".into())),
                min_ready_seconds: None,
                termination_grace_period_seconds: Some(30),
            },
            recorded: recorded.map(Into::into),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn without_a_rollout_block_nothing_is_written_into_the_workload() {
        let r = route(BASE);
        let (body, notes) = target_apply(
            r.spec.rollout.as_ref(),
            &target(Some("RollingUpdate"), None),
        );
        assert!(body.is_none(), "{body:?}");
        assert!(notes.is_empty());
        // Only pinning the grace period is no reason to touch the workload either.
        let r = route(&format!(
            "{BASE}  rollout: {{terminationGracePeriodSeconds: 90}}\n"
        ));
        assert!(
            target_apply(r.spec.rollout.as_ref(), &target(None, None))
                .0
                .is_none()
        );
    }

    #[test]
    fn an_explicit_rollout_block_writes_only_its_fields_and_remembers_originals() {
        let r = route(&format!(
            "{BASE}  rollout: {{maxUnavailable: 0, minReadySeconds: 3}}\n"
        ));
        let (body, notes) = target_apply(
            r.spec.rollout.as_ref(),
            &target(Some("RollingUpdate"), None),
        );
        let body = body.expect("fields to write");
        assert!(notes.is_empty());
        assert_eq!(
            body["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            0
        );
        assert!(
            body["spec"]["strategy"]["rollingUpdate"]
                .get("maxSurge")
                .is_none()
        );
        assert_eq!(body["spec"]["minReadySeconds"], 3);
        assert!(
            body["spec"].get("template").is_none(),
            "never the pod template: {body}"
        );
        let original = body["metadata"]["annotations"][keys::ORIGINAL]
            .as_str()
            .expect("string");
        assert_eq!(original, r#"{"maxUnavailable":"25%"}"#);
        // Once recorded, a field's record never changes (it would record our own values).
        let (again, _) = target_apply(r.spec.rollout.as_ref(), &target(None, Some(original)));
        assert_eq!(again.expect("body"), body);
        let (recreate, notes) =
            target_apply(r.spec.rollout.as_ref(), &target(Some("Recreate"), None));
        assert!(
            recreate.expect("minReadySeconds")["spec"]
                .get("strategy")
                .is_none()
        );
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn a_canary_rollout_gets_the_surge_fields_under_canary_and_a_blue_green_one_a_note() {
        let r = route(&format!(
            "{BASE}  rollout: {{maxSurge: 1, maxUnavailable: 0, minReadySeconds: 3}}\n"
        ));
        let rollout = |strategy: &str| Target {
            kind: TargetKind::Rollout,
            ..target(Some(strategy), None)
        };
        let (body, notes) = target_apply(r.spec.rollout.as_ref(), &rollout(CANARY));
        let body = body.expect("fields to write");
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(body["apiVersion"], "argoproj.io/v1alpha1");
        assert_eq!(body["kind"], "Rollout");
        assert_eq!(body["spec"]["strategy"]["canary"]["maxSurge"], 1);
        assert_eq!(body["spec"]["strategy"]["canary"]["maxUnavailable"], 0);
        assert!(
            body["spec"]["strategy"].get("rollingUpdate").is_none(),
            "{body}"
        );
        assert_eq!(body["spec"]["minReadySeconds"], 3);
        let recorded = body["metadata"]["annotations"][keys::ORIGINAL]
            .as_str()
            .expect("string")
            .to_string();
        let restore = restore_patch(&Target {
            recorded: Some(recorded),
            ..rollout(CANARY)
        })
        .expect("recorded");
        assert_eq!(restore["spec"]["strategy"]["canary"]["maxSurge"], "25%");

        let (body, notes) = target_apply(r.spec.rollout.as_ref(), &rollout(BLUE_GREEN));
        let body = body.expect("minReadySeconds");
        assert!(body["spec"].get("strategy").is_none(), "{body}");
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("blue-green"), "{notes:?}");
    }

    #[test]
    fn the_restore_patch_puts_originals_back_in_one_write() {
        let t = target(
            Some("RollingUpdate"),
            Some(r#"{"maxSurge":"25%","maxUnavailable":"25%"}"#),
        );
        let patch = restore_patch(&t).expect("recorded");
        assert_eq!(
            patch["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            "25%"
        );
        assert!(
            patch["spec"].get("template").is_none(),
            "pod template untouched: {patch}"
        );
        assert_eq!(
            patch["metadata"]["annotations"][keys::ORIGINAL],
            Value::Null
        );
        assert!(restore_patch(&target(None, None)).is_none());
        // A record from an earlier version (grace period in the template,
        // route pin) is put back too.
        let mut old = target(
            Some("RollingUpdate"),
            Some(r#"{"terminationGracePeriodSeconds":30}"#),
        );
        old.template = template("metadata: {annotations: {kubegrace.io/route: web}}");
        let patch = restore_patch(&old).expect("recorded");
        assert_eq!(
            patch["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            30
        );
        assert_eq!(
            patch["spec"]["template"]["metadata"]["annotations"][keys::ROUTE],
            Value::Null
        );
    }
}
