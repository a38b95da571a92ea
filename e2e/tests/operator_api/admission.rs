//! Admission: the API server refuses invalid routes with a message that says
//! what to fix, through the CRD schema and the operator's validating webhook.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, ResourceExt};
use kubegrace_operator::crd::GraceRoute;
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn the_api_server_refuses_invalid_routes_with_a_message_that_says_what_to_fix() {
    in_cluster("the_api_server_refuses_invalid_routes_with_a_message_that_says_what_to_fix", "kg-invalid", false, async |client, ns| {
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        let cases = [
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "drain": {"minDelay": "2 seconds"}}),
                "should match",
            ),
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "drain": {"minDelay": "20s", "maxDelay": "5s"}}),
                "minDelay 20s is longer than maxDelay 5s",
            ),
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "selector": {"matchLabels": {"app": "web"}}, "ports": [{"name": "http"}]}),
                "set exactly one of targetRef",
            ),
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "HTTP_PORT"}]}),
                "ports[0].name",
            ),
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "rollout": {"maxSurge": 0, "maxUnavailable": 0}}),
                "cannot both be 0",
            ),
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "routes": [{"name": "orders", "match": {"methods": ["POST"]}, "retry": {"idempotent": true}}]}),
                "would never retry anything",
            ),
            (
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "retryBudget": {"ratio": 3}}),
                "retryBudget.ratio",
            ),
        ];
        // Sent untyped: the point is what the API server says.
        let ar = ApiResource::erase::<GraceRoute>(&());
        let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
        for (i, (spec, expect)) in cases.into_iter().enumerate() {
            let route: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
                "metadata": {"name": format!("bad-{i}")},
                "spec": spec,
            }))
            .expect("object");
            let err = raw
                .create(&PostParams::default(), &route)
                .await
                .expect_err(&format!("case {i} must be refused"));
            let msg = err.to_string();
            assert!(
                msg.contains(expect),
                "case {i}: {msg:?} should say {expect:?}"
            );
        }
        // And the defaults a valid route gets from the schema.
        let ok: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": "good"},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}]},
        }))
        .expect("object");
        create(&raw, &ok, "valid route accepted").await;
        let _ = routes;
        let good = Api::<GraceRoute>::namespaced(client.clone(), &ns.name)
            .get("good")
            .await
            .expect("typed read");
        assert_eq!(good.spec.drain.max_delay.to_string(), "15s");
        assert!(
            good.spec.rollout.is_none(),
            "no rollout block is defaulted in: the workload's own strategy stays"
        );
        assert_eq!(
            good.spec.ports[0].protocol,
            kubegrace_operator::crd::PortProtocol::Http
        );
    })
    .await;
}

#[tokio::test]
async fn the_validating_webhook_refuses_an_unknown_port_and_an_over_budget_route_and_allows_a_missing_target()
 {
    in_cluster("the_validating_webhook_refuses_an_unknown_port_and_an_over_budget_route_and_allows_a_missing_target", "kg-admit", false, async |client, ns| {
        let port = free_port();
        validating_webhook_config(client, &ns.name, port).await;
        let (stop, task) = start_operator(client, &ns.name, port);
        let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        wait_for(
            60,
            "the operator's CA in the validating webhook",
            || async {
                let v = vwcs.get(&ns.name).await.ok()?;
                v.webhooks?
                    .iter()
                    .all(|w| w.client_config.ca_bundle.is_some())
                    .then_some(())
            },
        )
        .await;
        create_web_deployment(client, &ns.name).await;
        let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
        // The first call may reach the webhook before its listener is up: that
        // is a "failed calling webhook" error, not an answer. Retry until the
        // operator answers.
        let refused = |r: GraceRoute| {
            let routes = routes.clone();
            async move {
                wait_for(30, "an answer from the validating webhook", || async {
                    match routes.create(&PostParams::default(), &r).await {
                        Ok(_) => panic!("route {} must be refused", r.name_any()),
                        Err(e) if e.to_string().contains("failed calling webhook") => None,
                        Err(e) => Some(e.to_string()),
                    }
                })
                .await
            }
        };
        let msg = refused(graceroute_spec(
            "grpc",
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "grpc"}]}),
        ))
        .await;
        // The answer names what the review named, not the ports the
        // Deployment has (the caller may not be allowed to read it).
        assert!(
            msg.contains("denied the request: UnknownPort: Deployment/web has no container port named \"grpc\";"),
            "{msg}"
        );
        assert!(!msg.contains("(it has"), "{msg}");
        let msg = refused(graceroute_spec(
            "tight",
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}],
                   "drain": {"maxDelay": "10s", "timeout": "20s"},
                   "rollout": {"terminationGracePeriodSeconds": 20}}),
        ))
        .await;
        assert!(
            msg.contains("BudgetDoesNotFit: rollout.terminationGracePeriodSeconds is 20 but a drain needs 35s (drain.maxDelay 10s + drain.timeout 20s + 5s margin = 35s > 20s)"),
            "{msg}"
        );
        // GitOps order: the route first, its Deployment later.
        create(
            &routes,
            &graceroute("later", "not-yet"),
            "a route whose target does not exist yet is accepted",
        )
        .await;
        // A valid route, then an edit that breaks it: the edit is refused too.
        create(
            &routes,
            &graceroute("web", "web"),
            "a valid route is accepted",
        )
        .await;
        let err = patch_route_spec(&routes, "web", json!({"ports": [{"name": "admin"}]}))
            .await
            .expect_err("an edit to an unknown port is refused");
        assert!(
            err.to_string()
                .contains("no container port named \"admin\""),
            "{err}"
        );
        // The operator's own writes (status; the finalizer on and off for a
        // route that writes into its workload) go through the webhook and are
        // never refused.
        wait_for(60, "web Accepted", || async {
            let r = routes.get("web").await.ok()?;
            (condition(&r, "Accepted")?.0 == "True").then_some(())
        })
        .await;
        delete_routes(
            &routes,
            &["web", "later"],
            "routes gone (finalizers removed through the webhook)",
        )
        .await;
        stop_operator((stop, task)).await;
    })
    .await;
}
