//! The route controller through the real API server: reconcile, inject,
//! restore on delete, and conditions a person can act on.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use kubegrace_operator::crd::GraceRoute;
use kubegrace_sidecar_api::config::Config;
use kubegrace_sidecar_api::{keys, pod};
use serde_json::json;

use crate::harness::*;

/// Deployment `web` as [`deployment`] wrote it: the API server's default grace period
/// (30 s), no minReadySeconds, nothing of the operator's saved in it.
fn assert_left_as_written(d: &Deployment) {
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(
        spec.template
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds),
        Some(30)
    );
    assert_eq!(spec.min_ready_seconds.unwrap_or(0), 0);
    assert!(!d.annotations().contains_key(keys::ORIGINAL));
}

#[tokio::test]
async fn a_route_is_reconciled_injected_idempotent_and_restored_on_delete() {
    in_cluster("a_route_is_reconciled_injected_idempotent_and_restored_on_delete", "kg-route", false, async |client, ns| {
        let [port, admin] = free_ports::<2>();
        webhook_config(client, &ns.name, port, "Fail").await;
        let (stop, task) = start_operator_with_admin(client, &ns.name, port, admin);

        // The operator writes its CA into the webhook configuration.
        wait_ca_bundle(client, &ns.name).await;

        let deployments = create_serving_web_deployment(client, &ns.name).await;
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        let route = graceroute_spec(
            "web",
            json!({
                "targetRef": {"kind": "Deployment", "name": "web"},
                "ports": [{"name": "http"}],
                "drain": {"maxDelay": "10s", "timeout": "20s"},
                "routes": [{"name": "slow", "match": {"pathPrefix": "/slow"}, "timeout": "40s"}]
            }),
        );
        let started = std::time::Instant::now();
        create(&routes, &route, "create route").await;

        // Accepted, config written, budget = 10s + 40s (longest route) + 5s.
        let r = wait_for(60, "Accepted with budget", || async {
            let r = routes.get("web").await.ok()?;
            (r.status.as_ref()?.budget_seconds == Some(55)).then_some(r)
        })
        .await;
        let reconcile_time = started.elapsed();
        println!("first reconcile to status: {reconcile_time:?}");
        let (accepted, _, msg) = condition(&r, "Accepted").expect("Accepted");
        assert_eq!(accepted, "True", "{msg}");
        let (ready, reason, msg) = condition(&r, "Ready").expect("Ready");
        assert_eq!(
            (ready.as_str(), reason.as_str()),
            ("False", "InjectionNotEnabled"),
            "{msg}"
        );
        assert!(
            msg.contains("kubectl annotate deployment web kubegrace.io/inject=enabled"),
            "{msg}"
        );
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
            .get("kubegrace-web")
            .await
            .expect("ConfigMap");
        let yaml = cm
            .data
            .as_ref()
            .and_then(|d| d.get(pod::CONFIG_FILE))
            .expect("config.yaml");
        let config: Config = serde_norway::from_str(yaml).expect("the sidecar parses it");
        config.validate().expect("the sidecar accepts it");
        assert_eq!(config.drain.timeout.get(), Duration::from_secs(40));
        // No rollout block: the Deployment is left exactly as the user wrote it
        // (the grace period reaches pods through the webhook).
        let d = deployments.get("web").await.expect("deployment");
        assert_left_as_written(&d);
        assert_eq!(
            d.metadata.generation,
            Some(1),
            "the operator wrote nothing into it"
        );

        // Opt in: the operator copies the annotation into the template; the
        // rolled pods come back with the sidecar and the route turns Ready.
        annotate_inject(&deployments, "web").await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        wait_for(90, "an injected pod of web", || async {
            let list = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            list.items.iter().any(has_sidecar).then_some(())
        })
        .await;
        let r = wait_for(90, "route Ready", || async {
            let r = routes.get("web").await.ok()?;
            (condition(&r, "Ready")?.0 == "True").then_some(r)
        })
        .await;
        let status = r.status.expect("status");
        assert!(
            status.pods_injected >= 1 && status.pods_injected == status.pods_expected,
            "{status:?}"
        );
        // Ready means the rollout is done: no pod from before the annotation runs
        // beside the injected one (it said RollingOut until then).
        let bare: Vec<String> = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .expect("pods")
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && !has_sidecar(p))
            .map(|p| p.name_any())
            .collect();
        assert!(bare.is_empty(), "Ready with pods still bare: {bare:?}; {status:?}");

        // A pod created through the API server comes back injected, once.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "direct", "labels": { (keys::INJECT): "enabled" }, "annotations": { (keys::ROUTE): "web" }},
            "spec": {"containers": [{"name": "app", "image": pause_image(), "imagePullPolicy": "Never",
                     "ports": [{"name": "http", "containerPort": 8080}]}]}
        }))
        .expect("pod");
        let t0 = std::time::Instant::now();
        let created = create(&pods, &pod, "create pod").await;
        println!("pod create through the webhook: {:?}", t0.elapsed());
        assert!(has_sidecar(&created), "injected");
        let spec = created.spec.as_ref().expect("spec");
        let sidecar = spec
            .init_containers
            .as_ref()
            .map(|c| &c[0])
            .expect("native sidecar");
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        let app_port = spec.containers[0].ports.as_ref().expect("ports")[0].clone();
        assert_eq!(
            (app_port.name.as_deref(), app_port.container_port),
            (Some("kg-http"), 8080)
        );
        // Idempotent: the injected pod, submitted again, gains nothing.
        let mut again = created.clone();
        again.metadata = kube::api::ObjectMeta {
            name: Some("direct-again".into()),
            labels: created.metadata.labels.clone(),
            annotations: created.metadata.annotations.clone(),
            ..Default::default()
        };
        let again = create(&pods, &again, "create again").await;
        let count = |p: &Pod| {
            p.spec.as_ref().map_or(0, |s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .chain(s.containers.iter())
                    .filter(|c| c.name == pod::CONTAINER)
                    .count()
            })
        };
        assert_eq!(count(&again), 1);

        // Config changes reach the sidecars by hot reload: the ConfigMap
        // changes, the pod template does not (no pod restarts).
        let generation = |d: &Deployment| d.metadata.generation.unwrap_or(0);
        let before = generation(&deployments.get("web").await.expect("deployment"));
        let hash = routes
            .get("web")
            .await
            .expect("route")
            .status
            .and_then(|s| s.config_hash);
        patch_route_spec(&routes, "web", json!({"circuitBreaker": {"maxConcurrent": 10}}))
            .await
            .expect("change config");
        wait_for(30, "new config hash", || async {
            let r = routes.get("web").await.ok()?;
            let h = r.status?.config_hash;
            (h.is_some() && h != hash).then_some(())
        })
        .await;
        assert_eq!(
            generation(&deployments.get("web").await.expect("deployment")),
            before,
            "no roll"
        );
        // A budget change rolls nothing either: new pods get it from the webhook.
        patch_route_spec(&routes, "web", json!({"drain": {"timeout": "50s"}}))
            .await
            .expect("change budget");
        wait_for(30, "budget 65 in the status", || async {
            let r = routes.get("web").await.ok()?;
            (r.status?.budget_seconds == Some(10 + 50 + 5)).then_some(())
        })
        .await;
        let d = deployments.get("web").await.expect("deployment");
        assert_eq!(generation(&d), before, "a budget change rolls nothing");
        let mut next = pod.clone();
        next.metadata.name = Some("direct-65".into());
        let next = create(&pods, &next, "create pod").await;
        assert_eq!(
            next.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
            Some(65),
            "a new pod gets the new budget from the webhook"
        );

        // Numbers for the record: webhook and reconcile time as the operator sees them.
        let metrics = http_get(&format!("127.0.0.1:{admin}"), "/metrics")
            .await
            .expect("admin port");
        let value = |name: &str| -> f64 {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        for m in [
            "kubegrace_operator_webhook_duration_seconds",
            "kubegrace_operator_reconcile_duration_seconds",
        ] {
            let (sum, count) = (value(&format!("{m}_sum ")), value(&format!("{m}_count ")));
            println!(
                "{m}: {count} observations, mean {:.1}ms",
                if count > 0.0 { sum / count * 1e3 } else { 0.0 }
            );
        }
        assert!(
            metrics.contains("kubegrace_operator_webhook_requests_total{result=\"injected\"}"),
            "{metrics}"
        );

        // Removing the annotation removes what the operator copied into the
        // pod template (which rolls the pods back out).
        deployments
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": { (keys::INJECT): null }}})),
            )
            .await
            .expect("un-annotate");
        wait_for(30, "template label removed", || async {
            let d = deployments.get("web").await.ok()?;
            let labels = d.spec?.template.metadata?.labels.unwrap_or_default();
            (!labels.contains_key(keys::INJECT)).then_some(())
        })
        .await;

        // Deleting the route restores what it changed.
        delete_route(&routes, "web").await;
        let d = deployments.get("web").await.expect("deployment");
        assert_left_as_written(&d);
        let spec = d.spec.as_ref().expect("spec");
        assert!(
            spec.template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.as_ref())
                .is_none_or(|a| !a.contains_key(keys::ROUTE))
        );

        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("operator stops on the signal")
            .expect("join")
            .expect("clean exit");
    })
    .await;
}

#[tokio::test]
async fn an_unknown_port_and_an_overlapping_route_are_conditions_a_person_can_act_on() {
    in_cluster("an_unknown_port_and_an_overlapping_route_are_conditions_a_person_can_act_on", "kg-cond", false, async |client, ns| {
        let port = webhook_on_free_port(client, &ns.name, "Ignore").await;
        let (stop, task) = start_operator(client, &ns.name, port);
        create_web_deployment(client, &ns.name).await;
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        let route = |name: &str, port: &str| -> GraceRoute {
            graceroute_spec(
                name,
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": port}]}),
            )
        };
        create(&routes, &route("grpc", "grpc"), "create").await;
        let msg = wait_condition(&routes, "grpc", ("Accepted", "False", "UnknownPort")).await;
        assert!(
            msg.contains("Deployment/web has no container port named \"grpc\" (it has: http)"),
            "{msg}"
        );
        // Fixing the route fixes the condition (level-triggered).
        patch_route_spec(&routes, "grpc", json!({"ports": [{"name": "http"}]}))
            .await
            .expect("fix");
        wait_for(60, "Accepted after the fix", || async {
            let r = routes.get("grpc").await.ok()?;
            (condition(&r, "Accepted")?.0 == "True").then_some(())
        })
        .await;
        // A second route on the same workload is reported, not merged.
        create(&routes, &route("second", "http"), "create").await;
        let msg = wait_condition(&routes, "second", ("Degraded", "True", "Overlap")).await;
        assert!(
            msg.contains("Deployment/web is also targeted by GraceRoute grpc"),
            "{msg}"
        );
        delete_routes(&routes, &["second", "grpc"], "routes gone").await;
        stop_operator((stop, task)).await;
    })
    .await;
}
