//! The operator when things go wrong: its webhook down, itself killed in the
//! middle of a reconcile, a replica taking over the lead.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use kubegrace_operator::crd::GraceRoute;
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn with_the_webhook_down_and_failure_policy_ignore_pods_start_bare_and_the_route_says_so() {
    in_cluster("with_the_webhook_down_and_failure_policy_ignore_pods_start_bare_and_the_route_says_so", "kg-drift", true, async |client, ns| {
        // The webhook configuration points at a port nobody listens on.
        webhook_config(client, &ns.name, free_port(), "Ignore").await;
        let (stop, task) = start_operator(client, &ns.name, free_port());
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        let route = graceroute_spec(
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}, "ports": [{"name": "http"}]}),
        );
        create(&routes, &route, "create route").await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "bare", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": pause_image(), "imagePullPolicy": "Never",
                     "ports": [{"name": "http", "containerPort": 8080}]}]}
        }))
        .expect("pod");
        let created = create(&pods, &pod, "admitted despite the webhook").await;
        assert!(!has_sidecar(&created));
        let r = wait_condition(&routes, "web", ("Degraded", "True", "PodsNotInjected")).await;
        assert!(r.contains("1 of 1 pods lack the sidecar, e.g. bare"), "{r}");
        // ... and a person browsing events sees it too.
        wait_warning_event(client, &ns.name, "PodsNotInjected").await;
        stop_operator((stop, task)).await;
    })
    .await;
}

#[tokio::test]
async fn an_operator_killed_mid_reconcile_converges_when_it_starts_again() {
    in_cluster(
        "an_operator_killed_mid_reconcile_converges_when_it_starts_again",
        "kg-restart",
        false,
        async |client, ns| {
            let port = free_port();
            webhook_config(client, &ns.name, port, "Ignore").await;
            let deployments = create_web_deployment(client, &ns.name).await;
            let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
            let route = graceroute("web", "web");
            create(&routes, &route, "create route").await;
            let (_stop, task) = start_operator(client, &ns.name, port);
            // Kill it as soon as the reconcile has begun (the finalizer is its first write).
            wait_for(60, "finalizer added", || async {
                let r = routes.get("web").await.ok()?;
                (!r.finalizers().is_empty()).then_some(())
            })
            .await;
            task.abort();
            let _ = task.await;
            let (stop, task) = start_operator(client, &ns.name, port);
            let r = wait_for(90, "converged", || async {
                let r = routes.get("web").await.ok()?;
                let s = r.status.as_ref()?;
                (s.budget_seconds == Some(50) && s.config_hash.is_some()).then_some(r)
            })
            .await;
            assert_eq!(condition(&r, "Accepted").map(|c| c.0), Some("True".into()));
            // The budget reaches pods through the webhook; the Deployment keeps the
            // grace period it had (the API server default, 30 s): re-applies of the
            // user's manifest change nothing.
            let d = deployments.get("web").await.expect("deployment");
            assert_eq!(
                d.spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|s| s.termination_grace_period_seconds),
                Some(30)
            );
            delete_route(&routes, "web").await;
            stop_operator((stop, task)).await;
        },
    )
    .await;
}

/// Two replicas: both serve the webhook, one runs the controllers; when the
/// leader stops, the other takes over (it gave the Lease up on shutdown).
#[tokio::test]
async fn one_of_two_replicas_leads_and_the_other_takes_over() {
    in_cluster(
        "one_of_two_replicas_leads_and_the_other_takes_over",
        "kg-lease",
        false,
        async |client, ns| {
            let [a_port, b_port, a_admin, b_admin] = free_ports::<4>();
            let (a_stop, a_task) = start_operator_with_admin(client, &ns.name, a_port, a_admin);
            let (b_stop, b_task) = start_operator_with_admin(client, &ns.name, b_port, b_admin);
            let leader = |admin: u16| async move {
                let m = http_get(&format!("127.0.0.1:{admin}"), "/metrics").await?;
                let ready = http_get(&format!("127.0.0.1:{admin}"), "/readyz").await?;
                Some((
                    m.lines().any(|l| l.trim() == "kubegrace_operator_leader 1"),
                    ready.starts_with("HTTP/1.1 200"),
                ))
            };
            let (a_leads, b_leads) = wait_for(30, "one leader, both serving", || async {
                let (a, a_ready) = leader(a_admin).await?;
                let (b, b_ready) = leader(b_admin).await?;
                (a != b && a_ready && b_ready).then_some((a, b))
            })
            .await;
            assert!(a_leads ^ b_leads);
            let (stop_leader, leader_task, other_admin, other_stop, other_task) = if a_leads {
                (a_stop, a_task, b_admin, b_stop, b_task)
            } else {
                (b_stop, b_task, a_admin, a_stop, a_task)
            };
            let _ = stop_leader.send(());
            let _ = tokio::time::timeout(Duration::from_secs(20), leader_task).await;
            wait_for(30, "the other replica leads", || async {
                leader(other_admin).await.and_then(|(l, _)| l.then_some(()))
            })
            .await;
            let _ = other_stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(20), other_task).await;
        },
    )
    .await;
}
