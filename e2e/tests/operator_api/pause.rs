//! `rollout.pauseOnDrainLoss` against the real API server, the drain reports fed by hand.
//!
//! The Deployment's pods can never be scheduled (a node selector no node has), so after a
//! `rollout restart` its rollout stays under way (old pods left, the new one never
//! available); the test writes that status itself too, so it needs no controller. The drained pods are written as the kubelet would leave them: pending pods
//! pinned to the route (`kubegrace.io/route`), selected by the Deployment (a template hash
//! no ReplicaSet has, so none adopts them), whose sidecar container status is
//! `terminated` with the drain report as its message, set through the status subresource.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubegrace_operator::controller::pause::{self, PAUSE_FIELD_MANAGER, RESUMED_AT};
use kubegrace_operator::crd::GraceRoute;
use kubegrace_sidecar_api::{keys, pod as sidecar_pod};
use serde_json::json;

use super::harness::*;

/// A label no node has: the pods stay Pending, no kubelet writes their status.
const NOWHERE: (&str, &str) = ("kubegrace.io/test-no-such-node", "true");

fn unschedulable_deployment() -> Deployment {
    let mut d = deployment("web");
    if let Some(spec) = d.spec.as_mut() {
        spec.replicas = Some(2);
        if let Some(pod) = spec.template.spec.as_mut() {
            pod.node_selector = Some(BTreeMap::from([(NOWHERE.0.into(), NOWHERE.1.into())]));
        }
    }
    d
}

/// A drained pod of `web`'s old revision, as its last status shows it: the sidecar
/// terminated at `finished` with a report of `cut` requests cut (and as many
/// connections force-closed).
async fn drained_pod(client: &Client, ns: &str, name: &str, cut: u64, finished: jiff::Timestamp) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": "web", "pod-template-hash": "drained0"},
            "annotations": {(keys::ROUTE): "web"},
        },
        "spec": {
            "nodeSelector": {(NOWHERE.0): NOWHERE.1},
            "containers": [{"name": sidecar_pod::CONTAINER, "image": pause_image(), "imagePullPolicy": "Never"}],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create drained pod");
    let report = json!({
        "kind": kubegrace_sidecar_api::report::KIND, "trigger": "SIGTERM", "durationMs": 4000,
        "connections": 2, "inflightAtTrigger": cut, "requestsFinished": 3,
        "forceClosed": cut, "requestsCut": cut,
    });
    let status = json!({"status": {"containerStatuses": [{
        "name": sidecar_pod::CONTAINER, "image": pause_image(), "imageID": "", "ready": false,
        "restartCount": 0,
        "state": {"terminated": {
            "exitCode": 0, "reason": "Completed", "message": report.to_string(),
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": finished.to_string(),
        }},
    }]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the drained pod's status");
}

fn paused(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.paused) == Some(true)
}

/// What `kubectl kubegrace resume web` does: the time on the route, then the unpause.
async fn resume(client: &Client, ns: &str, routes: &Api<GraceRoute>) -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    routes
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {RESUMED_AT: now.to_string()}}})),
        )
        .await
        .expect("annotate the route");
    pause::set_paused(
        client,
        ns,
        kubegrace_operator::crd::TargetKind::Deployment,
        "web",
        false,
    )
    .await
    .expect("resume the Deployment");
    now
}

/// Waits for the Deployment controller's ReplicaSet of `web`'s first revision.
async fn first_replicaset(client: &Client, ns: &str) {
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    wait_for(60, "web's first ReplicaSet", || async {
        let list = sets.list(&Default::default()).await.ok()?;
        let owned = |s: &ReplicaSet| {
            s.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Deployment" && o.name == "web")
        };
        list.items.iter().any(owned).then_some(())
    })
    .await;
}

async fn counted(routes: &Api<GraceRoute>, pods: i32) {
    wait_for(60, &format!("lastDrains counts {pods} pods"), || async {
        let r = routes.get("web").await.ok()?;
        let last = r.status?.last_drains?;
        (last.pods >= pods).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_lossy_drain_of_a_rolling_deployment_pauses_it_and_an_older_one_does_not_after_resume() {
    in_cluster(
        "a_lossy_drain_of_a_rolling_deployment_pauses_it_and_an_older_one_does_not_after_resume",
        "kg-pause",
        false,
        async |client, ns| {
            let port = webhook_on_free_port(client, &ns.name, "Ignore").await;
            let operator = start_operator(client, &ns.name, port);
            let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
            create(
                &deployments,
                &unschedulable_deployment(),
                "create deployment",
            )
            .await;
            // The first revision's ReplicaSet before the restart: a Deployment controller
            // that first sees the restarted template finds no old ReplicaSet, makes one new
            // one of 2 replicas, and the rollout is over before the drains (a CI flake on a
            // loaded machine: no pause within 60 s).
            first_replicaset(client, &ns.name).await;
            // A rollout that never ends: the new pod is never available. Its status is
            // written here too, as the Deployment controller computes it (2 old pods and 1
            // new, surged: maxSurge 25% of 2 rounds up to 1, maxUnavailable down to 0), so the
            // condition holds from this write on, not from the controller's next pass.
            let d = deployments
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(kubegrace_load::rollout::restart_patch(1.0)),
                )
                .await
                .expect("rollout restart");
            deployments
                .patch_status(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "observedGeneration": d.metadata.generation,
                        "replicas": 3, "updatedReplicas": 1, "unavailableReplicas": 3,
                    }})),
                )
                .await
                .expect("the rollout's status");
            wait_for(60, "the rollout under way", || async {
                let d = deployments.get("web").await.ok()?;
                let s = d.status?;
                let seen = s.observed_generation >= d.metadata.generation;
                let updated = s.updated_replicas.unwrap_or(0);
                (seen && updated >= 1 && s.replicas.unwrap_or(0) > updated).then_some(())
            })
            .await;
            let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
            let spec = |on: bool| {
                json!({
                    "targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}],
                    "rollout": {"pauseOnDrainLoss": on},
                })
            };
            create(&routes, &graceroute_spec("web", spec(true)), "create route").await;
            wait_condition(&routes, "web", ("Accepted", "True", "Valid")).await;

            // A clean drain does not pause.
            drained_pod(client, &ns.name, "web-clean", 0, jiff::Timestamp::now()).await;
            counted(&routes, 1).await;
            assert!(
                !paused(&deployments.get("web").await.expect("get")),
                "paused by a clean drain"
            );

            // The first lossy drain does.
            drained_pod(client, &ns.name, "web-lossy", 1, jiff::Timestamp::now()).await;
            let msg = wait_condition(
                &routes,
                "web",
                (pause::ROLLOUT_PAUSED, "True", pause::DRAIN_LOSS),
            )
            .await;
            assert!(
                msg.contains("pod web-lossy") && msg.contains("cut 1 requests"),
                "{msg}"
            );
            let d = deployments.get("web").await.expect("get");
            assert!(paused(&d), "the Deployment is not paused");
            assert!(
                d.metadata
                    .managed_fields
                    .iter()
                    .flatten()
                    .any(|m| m.manager.as_deref() == Some(PAUSE_FIELD_MANAGER)),
                "spec.paused not written by {PAUSE_FIELD_MANAGER}"
            );
            wait_warning_event(client, &ns.name, pause::ROLLOUT_PAUSED).await;

            // Resumed: the condition says so, and a drain that ended before the resume (its
            // report seen only now) does not pause again.
            let resumed_at = resume(client, &ns.name, &routes).await;
            wait_condition(
                &routes,
                "web",
                (pause::ROLLOUT_PAUSED, "False", pause::RESUMED),
            )
            .await;
            let before = resumed_at - jiff::SignedDuration::from_secs(5);
            drained_pod(client, &ns.name, "web-before-resume", 1, before).await;
            counted(&routes, 3).await;
            assert!(
                !paused(&deployments.get("web").await.expect("get")),
                "paused again by a drain older than the resume"
            );

            // A lossy drain after the resume pauses again. finishedAt and lastTransitionTime
            // are stored to the second: an end in the same second as the resume would be
            // ignored, so this one ends two seconds on.
            let after = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(2);
            drained_pod(client, &ns.name, "web-after-resume", 2, after).await;
            let msg = wait_condition(
                &routes,
                "web",
                (pause::ROLLOUT_PAUSED, "True", pause::DRAIN_LOSS),
            )
            .await;
            assert!(msg.contains("pod web-after-resume"), "{msg}");

            // Without the option the same loss leaves the rollout alone.
            resume(client, &ns.name, &routes).await;
            patch_route_spec(&routes, "web", spec(false))
                .await
                .expect("option off");
            wait_for(
                60,
                "the RolloutPaused condition gone with the option",
                || async {
                    let r = routes.get("web").await.ok()?;
                    r.condition(pause::ROLLOUT_PAUSED).is_none().then_some(())
                },
            )
            .await;
            drained_pod(
                client,
                &ns.name,
                "web-option-off",
                1,
                jiff::Timestamp::now(),
            )
            .await;
            counted(&routes, 5).await;
            assert!(
                !paused(&deployments.get("web").await.expect("get")),
                "paused without the option"
            );
            stop_operator(operator).await;
        },
    )
    .await;
}
