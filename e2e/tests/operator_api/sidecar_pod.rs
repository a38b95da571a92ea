//! An injected pod with the real sidecar image: it serves through the
//! sidecar and drains within its budget.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use kubegrace_operator::crd::GraceRoute;
use kubegrace_sidecar_api::{admin, pod};
use serde_json::json;

use kubegrace_e2e::demo_image;

use crate::harness::*;

/// The real thing: the sidecar image runs as injected (restricted security
/// context, flags, config file, probes), the app behind it answers through
/// it, and a deleted pod drains within its budget. Needs the images of
/// `e2e/cluster/images` (fails without them).
#[tokio::test]
async fn an_injected_pod_runs_serves_through_the_sidecar_and_drains_within_its_budget() {
    in_cluster("an_injected_pod_runs_serves_through_the_sidecar_and_drains_within_its_budget", "kg-run", true, async |client, ns| {
        // In the cluster tier a missing image is a failure, not a skip.
        kubegrace_e2e::require_images(client, &[kubegrace_e2e::sidecar_image(), demo_image()])
            .await
            .expect("the e2e images");
        let port = webhook_on_free_port(client, &ns.name, "Fail").await;
        let (stop, task) = start_operator(client, &ns.name, port);
        wait_ca_bundle(client, &ns.name).await;
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        let route = graceroute_spec(
            "demo",
            json!({"targetRef": {"kind": "Deployment", "name": "demo"}, "ports": [{"name": "http"}],
                     "drain": {"minDelay": "1s", "quiet": "500ms", "maxDelay": "3s", "timeout": "5s"}}),
        );
        create(&routes, &route, "create route").await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
        let demo = deployment_with(
            "demo",
            json!({
                "name": "app", "image": demo_image(), "imagePullPolicy": "Never",
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1}
            }),
        );
        create(&deployments, &demo, "create").await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        let pod = wait_for(120, "an injected demo pod Ready", || async {
            let list = pods
                .list(&ListParams::default().labels("app=demo"))
                .await
                .ok()?;
            list.items
                .into_iter()
                .find(|p| has_sidecar(p) && pod_ready(p) && p.metadata.deletion_timestamp.is_none())
        })
        .await;
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("pod IP");
        let through = wait_for(20, "the app through the sidecar", || async {
            let r = http_get(&format!("{ip}:{}", pod::FIRST_LISTEN_PORT), "/").await?;
            r.starts_with("HTTP/1.1 200").then_some(r)
        })
        .await;
        assert!(through.contains("pod="), "{through}");
        let admin_port = kubegrace_operator::inject::admin_port_of(&pod).expect("a kg-admin port");
        let ready = http_get(&format!("{ip}:{admin_port}"), admin::path::READY)
            .await
            .expect("admin port");
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
        // Without the pod's token nobody may drain it.
        let drain = http_get(&format!("{ip}:{admin_port}"), admin::path::DRAIN)
            .await
            .expect("admin port");
        assert!(!drain.starts_with("HTTP/1.1 2"), "{drain}");

        let budget = routes
            .get("demo")
            .await
            .ok()
            .and_then(|r| r.status?.budget_seconds)
            .expect("budget");
        assert_eq!(budget, 3 + 5 + 5);
        let name = pod.name_any();
        let t0 = std::time::Instant::now();
        pods.delete(&name, &DeleteParams::default())
            .await
            .expect("delete pod");
        wait_for(
            u64::try_from(budget).unwrap_or(13) + 15,
            "pod gone",
            || async { pods.get_opt(&name).await.ok()?.is_none().then_some(()) },
        )
        .await;
        let took = t0.elapsed();
        println!("injected pod terminated in {took:?} (budget {budget}s)");
        assert!(
            took >= Duration::from_secs(1),
            "the drain held the pod for at least minDelay"
        );

        stop_operator((stop, task)).await;
    })
    .await;
}
