use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use serde_json::json;

use super::*;
use crate::controller::fixtures::{at, drain, state};

fn rolling() -> Vec<RolloutState> {
    vec![state(TargetKind::Deployment, "web", false, true)]
}

fn paused_name(v: Option<Verdict>) -> Option<(String, String)> {
    match v? {
        Verdict::Pause(l) => Some(("pause".into(), l.drain.pod)),
        Verdict::CannotPause(l) => Some(("cannot".into(), l.drain.pod)),
    }
}

#[test]
fn one_force_closed_connection_or_one_cut_request_pauses_and_a_clean_drain_does_not() {
    for (fc, cut, pauses) in [(0, 0, false), (1, 0, true), (0, 1, true), (1, 1, true)] {
        let v = decide(
            true,
            &[drain("web-a", fc, cut, Some(100))],
            &rolling(),
            None,
        );
        assert_eq!(v.is_some(), pauses, "force_closed {fc} requests_cut {cut}");
    }
    // The first lossy drain of the pass is named, clean ones skipped.
    let v = decide(
        true,
        &[drain("web-a", 0, 0, Some(1)), drain("web-b", 2, 5, Some(2))],
        &rolling(),
        None,
    );
    assert_eq!(paused_name(v), Some(("pause".into(), "web-b".into())));
}

#[test]
fn without_the_option_nothing_pauses() {
    let v = decide(false, &[drain("web-a", 1, 1, Some(100))], &rolling(), None);
    assert_eq!(v, None);
}

/// The verdict on one lossy drain of `web-a`, with the option on.
fn one_loss(rollouts: &[RolloutState]) -> Option<Verdict> {
    decide(true, &[drain("web-a", 1, 1, Some(100))], rollouts, None)
}

#[test]
fn a_scale_down_or_a_finished_rollout_is_not_paused() {
    let done = vec![state(TargetKind::Deployment, "web", false, false)];
    assert_eq!(one_loss(&done), None);
}

#[test]
fn a_deployment_paused_by_someone_else_is_left_alone_and_one_paused_here_is_paused_again() {
    let mut by_user = rolling();
    by_user[0].paused = true;
    assert_eq!(one_loss(&by_user), None);
    // Our pause whose status write failed: the retry decides the same.
    by_user[0].paused_here = true;
    assert_eq!(
        paused_name(one_loss(&by_user)),
        Some(("pause".into(), "web-a".into()))
    );
}

#[test]
fn only_a_drain_that_ended_after_the_last_pause_or_resume_counts() {
    let since = Some(at(100).0);
    for (end, pauses) in [(Some(99), false), (Some(100), false), (Some(101), true)] {
        let v = decide(true, &[drain("web-a", 1, 1, end)], &rolling(), since);
        assert_eq!(v.is_some(), pauses, "drain ended at {end:?}, since 100");
    }
    // No end time recorded: the report is new this pass (each pod is
    // counted once), so it counts.
    let v = decide(true, &[drain("web-a", 1, 1, None)], &rolling(), since);
    assert!(v.is_some());
}

#[test]
fn a_statefulset_is_reported_not_paused() {
    let sts = vec![state(TargetKind::StatefulSet, "web", false, true)];
    let v = decide(true, &[drain("web-0", 1, 1, Some(1))], &sts, None);
    assert_eq!(paused_name(v), Some(("cannot".into(), "web-0".into())));
}

#[test]
fn an_argo_rollout_is_paused_like_a_deployment_unless_someone_else_paused_it() {
    let rollout = vec![state(TargetKind::Rollout, "web", false, true)];
    let v = decide(true, &[drain("web-a", 1, 1, Some(1))], &rollout, None);
    assert!(
        matches!(&v, Some(Verdict::Pause(l)) if l.kind == TargetKind::Rollout),
        "{v:?}"
    );
    // Paused by `kubectl argo rollouts pause`: not ours to claim.
    let theirs = vec![state(TargetKind::Rollout, "web", true, true)];
    assert_eq!(one_loss(&theirs), None);
}

#[test]
fn a_pod_of_another_workload_does_not_pause_this_one() {
    let other = vec![state(TargetKind::Deployment, "api", false, true)];
    assert_eq!(one_loss(&other), None);
    // The same drain does pause the workload its pod belongs to.
    let both = [other[0].clone(), rolling()[0].clone()];
    assert_eq!(
        paused_name(one_loss(&both)),
        Some(("pause".into(), "web-a".into()))
    );
}

#[test]
fn the_condition_names_the_pod_its_loss_and_the_fix() {
    let v = decide(true, &[drain("web-a", 2, 3, Some(1))], &rolling(), None);
    let c = condition(None, v.as_ref(), &rolling(), true, Some(4), at(5)).expect("condition");
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (ROLLOUT_PAUSED, "True", DRAIN_LOSS)
    );
    for part in [
        "Deployment/web paused",
        "pod web-a",
        "force-closed 2 connections",
        "cut 3 requests",
        "raise drain.timeout",
        "kubectl kubegrace resume",
    ] {
        assert!(c.message.contains(part), "{part:?} not in {}", c.message);
    }
    assert_eq!(c.observed_generation, Some(4));
}

#[test]
fn a_pause_holds_while_paused_and_turns_resumed_when_not() {
    let v = decide(true, &[drain("web-a", 1, 1, Some(1))], &rolling(), None);
    let paused = condition(None, v.as_ref(), &rolling(), true, None, at(5)).expect("paused");
    let mut still = rolling();
    still[0].paused = true;
    // Held, even with the option turned off meanwhile: it says why the
    // Deployment is paused.
    for enabled in [true, false] {
        let held = condition(Some(&paused), None, &still, enabled, None, at(9));
        assert_eq!(held.as_ref(), Some(&paused));
    }
    let resumed = condition(Some(&paused), None, &rolling(), true, None, at(9)).expect("resumed");
    assert_eq!(
        (resumed.status.as_str(), resumed.reason.as_str()),
        ("False", RESUMED)
    );
    assert!(resumed.message.contains("pod web-a"), "{}", resumed.message);
    assert_eq!(resumed.last_transition_time, at(9));
    // A False condition stays while the option is on, and goes with it.
    let kept = condition(Some(&resumed), None, &rolling(), true, None, at(20));
    assert_eq!(kept.as_ref(), Some(&resumed));
    assert_eq!(
        condition(Some(&resumed), None, &rolling(), false, None, at(20)),
        None
    );
    assert_eq!(condition(None, None, &rolling(), true, None, at(20)), None);
}

fn deployment(yaml: &str) -> Deployment {
    serde_norway::from_str(yaml).expect("deployment fixture")
}

const ROLLING: &str = r#"
metadata: {name: web, generation: 3}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template: {metadata: {labels: {app: web}}}
status: {observedGeneration: 3, replicas: 3, updatedReplicas: 1}
"#;

#[test]
fn a_deployment_is_progressing_until_every_pod_is_of_the_new_revision() {
    let cases = [
        (ROLLING.to_string(), true),
        // Every pod created from the new template, an old one still there.
        (
            ROLLING.replace(
                "replicas: 3, updatedReplicas: 1",
                "replicas: 4, updatedReplicas: 3",
            ),
            true,
        ),
        // The controller has not seen the new spec yet.
        (
            ROLLING.replace("observedGeneration: 3", "observedGeneration: 2"),
            true,
        ),
        (
            ROLLING.replace("updatedReplicas: 1", "updatedReplicas: 3"),
            false,
        ),
    ];
    for (yaml, progressing) in cases {
        let s = deployment_state(&deployment(&yaml)).expect("state");
        assert_eq!(s.progressing, progressing, "{yaml}");
        assert!(!s.paused && !s.paused_here);
    }
}

/// [`ROLLING`], paused by the field manager `manager`.
fn paused_by(manager: &str) -> Deployment {
    let managed = format!(
        r#"managedFields: [{{manager: {manager}, operation: Update, fieldsType: FieldsV1, fieldsV1: {{"f:spec": {{"f:paused": {{}}}}}}}}]"#
    );
    deployment(
        &ROLLING
            .replace("generation: 3}", &format!("generation: 3, {managed}}}"))
            .replace("spec:\n", "spec:\n  paused: true\n"),
    )
}

#[test]
fn a_pause_written_by_the_pause_field_manager_is_ours() {
    let ours = paused_by(PAUSE_FIELD_MANAGER);
    let s = deployment_state(&ours).expect("state");
    assert!(s.paused && s.paused_here && s.progressing);
    let theirs = paused_by("kubectl-rollout");
    let s = deployment_state(&theirs).expect("state");
    assert!(s.paused && !s.paused_here);
}

#[test]
fn the_resume_annotation_or_the_condition_whichever_is_later_bounds_old_drains() {
    let route = |annotation: Option<&str>, transition: Option<i64>| {
        let mut r = crate::controller::fixtures::route(crate::controller::fixtures::ROUTE);
        if let Some(a) = annotation {
            r.metadata.annotations = Some(BTreeMap::from([(RESUMED_AT.to_string(), a.into())]));
        }
        if let Some(t) = transition {
            let mut c = condition(
                None,
                decide(true, &[drain("web-a", 1, 1, None)], &rolling(), None).as_ref(),
                &rolling(),
                true,
                None,
                at(t),
            );
            r.status = Some(crate::crd::GraceRouteStatus {
                conditions: c.take().into_iter().collect(),
                ..Default::default()
            });
        }
        r
    };
    assert_eq!(since(&route(None, None)), None);
    assert_eq!(since(&route(None, Some(50))), Some(at(50).0));
    let later = at(80).0.to_string();
    assert_eq!(since(&route(Some(&later), Some(50))), Some(at(80).0));
    assert_eq!(since(&route(Some(&later), Some(90))), Some(at(90).0));
    // Not a time: ignored, the condition still bounds.
    assert_eq!(since(&route(Some("yesterday"), Some(50))), Some(at(50).0));
}

#[tokio::test]
async fn the_pause_is_a_merge_patch_of_spec_paused_by_its_own_field_manager() {
    for (kind, path) in [
        (
            TargetKind::Deployment,
            "/apis/apps/v1/namespaces/shop/deployments/web",
        ),
        (
            TargetKind::Rollout,
            "/apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web",
        ),
    ] {
        let (client, mut api) = crate::testing::mock();
        let script = async move {
            let answer = serde_json::to_value(deployment(ROLLING)).expect("json");
            let seen = crate::testing::answer(&mut api, &answer).await;
            assert_eq!(seen.call(), ("PATCH", path));
            let manager = format!("fieldManager={PAUSE_FIELD_MANAGER}");
            assert!(seen.query.contains(&manager), "{}", seen.query);
            assert_eq!(seen.content_type, "application/merge-patch+json");
            assert_eq!(seen.body, json!({"spec": {"paused": true}}));
        };
        crate::testing::scripted(script, set_paused(&client, "shop", kind, "web", true))
            .await
            .expect("pause succeeds");
    }
}

#[test]
fn a_statefulset_rolls_until_its_update_revision_is_current_and_gets_cannot_pause() {
    let sts = |current: &str| -> StatefulSet {
        serde_norway::from_str(&format!(
            r#"
metadata: {{name: web, generation: 2}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: web}}}}
  serviceName: web
  template: {{metadata: {{labels: {{app: web}}}}}}
status: {{observedGeneration: 2, replicas: 3, updatedReplicas: 3, currentRevision: {current}, updateRevision: web-2}}
"#
        ))
        .expect("statefulset fixture")
    };
    let rolling = statefulset_state(&sts("web-1")).expect("state");
    assert!(rolling.progressing && !rolling.paused);
    assert!(!statefulset_state(&sts("web-2")).expect("state").progressing);
    let v = decide(
        true,
        &[drain("web-0", 1, 1, Some(1))],
        std::slice::from_ref(&rolling),
        None,
    );
    let c = condition(None, v.as_ref(), &[rolling], true, None, at(5)).expect("condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", CANNOT_PAUSE)
    );
    assert!(
        c.message.contains("StatefulSet/web not paused") && c.message.contains("pod web-0"),
        "{}",
        c.message
    );
}
