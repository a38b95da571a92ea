//! The operator when things go wrong: its webhook down, itself killed in the
//! middle of a reconcile, a replica taking over the lead, a stored route it
//! cannot decode.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::core::DynamicObject;
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
            let port = webhook_on_free_port(client, &ns.name, "Ignore").await;
            let deployments = create_web_deployment(client, &ns.name).await;
            let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
            let route = graceroute("web", "web");
            create(&routes, &route, "create route").await;
            let (_stop, task) = start_operator(client, &ns.name, port);
            // Kill it as soon as the reconcile has begun: the route's ConfigMap is its
            // first write (a route without a rollout block holds no finalizer).
            let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
            wait_for(60, "the route's ConfigMap written", || async {
                config_maps.get_opt("kubegrace-web").await.ok()?.map(|_| ())
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

/// A route stored with a value the operator's types refuse (as under an
/// older, looser schema) affects that route alone: across a restart of the
/// operator the route in another namespace is reconciled (its
/// observedGeneration catches up after an edit), the bad one is reported by
/// name (condition, Event, metric), and nothing panics.
#[tokio::test]
async fn an_undecodable_route_affects_itself_only_across_an_operator_restart() {
    in_cluster(
        "an_undecodable_route_affects_itself_only_across_an_operator_restart",
        "kg-undecodable",
        false,
        async |client, ns| {
            let good_ns = TestNs::new(client, "kg-decodable", false).await;
            create_web_deployment(client, &good_ns.name).await;
            let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &good_ns.name);
            create(&routes, &graceroute("good", "web"), "create the good route").await;
            store_undecodable(client, &ns.name).await;

            let [port, admin] = free_ports::<2>();
            let operator = start_operator_with_admin(client, &ns.name, port, admin);
            wait_observed(&routes, "good").await;
            stop_operator(operator).await;

            // Edited while the operator is down: the new one's initial list
            // holds the bad route too.
            let edited = patch_route_spec(&routes, "good", json!({"drain": {"maxDelay": "6s"}}))
                .await
                .expect("edit the good route");
            let (stop, task) = start_operator_with_admin(client, &ns.name, port, admin);
            let seen = wait_observed(&routes, "good").await;
            assert!(seen >= edited.metadata.generation.unwrap_or(2));

            let bad = kubegrace_operator::tolerant::api(client, Some(&ns.name));
            let message = wait_for(60, "bad: Accepted=False InvalidObject", || async {
                let obj = bad.get("bad").await.ok()?;
                let c = obj.data["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Accepted")?
                    .clone();
                (c["status"] == "False" && c["reason"] == "InvalidObject")
                    .then(|| c["message"].as_str().unwrap_or_default().to_string())
            })
            .await;
            assert!(
                message.contains("spec.circuitBreaker.consecutiveFailures"),
                "{message}"
            );
            wait_warning_event(client, &ns.name, "InvalidObject").await;
            let metrics = wait_for(30, "the undecodable route's series", || async {
                let m = http_get(&format!("127.0.0.1:{admin}"), "/metrics").await?;
                m.contains(&format!(
                    "kubegrace_operator_route_undecodable{{namespace=\"{}\",name=\"bad\"}} 1",
                    ns.name
                ))
                .then_some(m)
            })
            .await;
            for task_name in ["reconcile", "webhook", "background"] {
                let line = format!("kubegrace_operator_panics_total{{task=\"{task_name}\"}} 0");
                assert!(metrics.contains(&line), "{line} missing");
            }
            assert!(!task.is_finished(), "the operator stopped");

            delete_route(&routes, "good").await;
            stop_operator((stop, task)).await;
            good_ns.cleanup().await;
        },
    )
    .await;
}

/// Waits until route `name` reports the generation it has; returns it.
async fn wait_observed(routes: &Api<GraceRoute>, name: &str) -> i64 {
    wait_for(
        90,
        &format!("{name}: observedGeneration == generation"),
        || async {
            let r = routes.get(name).await.ok()?;
            let generation = r.metadata.generation?;
            let accepted = condition(&r, "Accepted").map(|c| c.0);
            (r.status.as_ref()?.observed_generation == Some(generation)
                && accepted.as_deref() == Some("True"))
            .then_some(generation)
        },
    )
    .await
}

/// Stores route `bad` with `consecutiveFailures: 4294967296` (no `u32`).
/// Where the installed CRD has a `maximum` for the field, the route is
/// stored under a copy without it, and the generated CRD is put back: the
/// CRD upgrade after which such objects remain.
async fn store_undecodable(client: &kube::Client, ns: &str) {
    let api = kubegrace_operator::tolerant::api(client, Some(ns));
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": "bad"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}],
                 "circuitBreaker": {"consecutiveFailures": 4_294_967_296_u64}},
    }))
    .expect("route");
    if api.create(&PostParams::default(), &obj).await.is_ok() {
        return;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get("graceroutes.kubegrace.io").await.expect("the CRD");
    let mut loose = serde_json::to_value(&crd).expect("json");
    let field = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/circuitBreaker/properties/consecutiveFailures";
    if let Some(schema) = loose.pointer_mut(field).and_then(|v| v.as_object_mut()) {
        schema.remove("maximum");
    }
    let loose: CustomResourceDefinition = serde_json::from_value(loose).expect("crd");
    crds.replace("graceroutes.kubegrace.io", &PostParams::default(), &loose)
        .await
        .expect("a CRD without the bound");
    let stored = wait_for(30, "the route stored under the looser schema", || async {
        api.create(&PostParams::default(), &obj).await.ok()
    })
    .await;
    install_crd(client).await;
    assert_eq!(stored.name_any(), "bad");
}
