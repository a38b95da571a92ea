//! The status step's one write, against a scripted API server: the order
//! of its calls, and what a failed write leaves for the retry.

use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::*;
use crate::controller::context::Context;
use crate::controller::dereference::Observed;
use crate::controller::fixtures::{
    DEPLOYMENT, ROUTE, checked, drain, observed, route, scripted_context, state,
};
use crate::crd::{GraceRoute, TargetKind};
use crate::testing::{Handle, answer_with, no_more, reply, scripted};

const STATUS_PATH: &str = "/apis/kubegrace.io/v1alpha1/namespaces/shop/graceroutes/web/status";
const DEPLOY_PATH: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
const INJECTED_POD: &str = "metadata: {name: web-1, namespace: shop, labels: {app: web, kubegrace.io/inject: enabled}, annotations: {kubegrace.io/injected: 'true'}}\nspec: {terminationGracePeriodSeconds: 60, containers: []}";

/// The route `yaml` fronting [`DEPLOYMENT`] (rolling), its first report,
/// and a context whose inbox holds a lossy drain of `web-1`.
fn lossy_pass(yaml: &str) -> (GraceRoute, Observed, Report, Context, Handle) {
    let r = route(yaml);
    let mut seen = observed(&r, &[DEPLOYMENT], &[crate::testing::yaml(INJECTED_POD)]);
    seen.rollouts = vec![state(TargetKind::Deployment, "web", false, true)];
    let (valid, d) = checked(&r, &seen);
    let report = accepted(&r, &seen, &valid, &d);
    let (ctx, api) = scripted_context();
    ctx.drains
        .put_back(&ObjectRef::from_obj(&r), vec![drain("web-1", 1, 1, None)]);
    (r, seen, report, ctx, api)
}

/// Answers every further request with `{}` until none comes; their paths.
async fn rest(api: &mut Handle) -> Vec<String> {
    let mut paths = Vec::new();
    while let Ok(Some((req, send))) =
        tokio::time::timeout(std::time::Duration::from_millis(100), api.next_request()).await
    {
        paths.push(req.uri().path().to_string());
        send.send_response(http::Response::new(kube::client::Body::from(
            b"{}".to_vec(),
        )));
        if paths.len() > 20 {
            break;
        }
    }
    paths
}

#[tokio::test]
async fn the_pause_comes_before_the_status_and_the_events_after_it() {
    let yaml = format!("{ROUTE}  rollout: {{pauseOnDrainLoss: true}}\n");
    let (r, seen, report, ctx, mut api) = lossy_pass(&yaml);
    let mut echo = serde_json::to_value(&r).expect("route json");
    echo["metadata"]["resourceVersion"] = "77".into();
    let deployment: Value = serde_norway::from_str(DEPLOYMENT).expect("deployment");
    let script = async move {
        let pause = answer_with(&mut api, 200, &deployment).await;
        assert_eq!(pause.call(), ("PATCH", DEPLOY_PATH));
        assert_eq!(pause.body, json!({"spec": {"paused": true}}));
        let status = reply(&mut api, 200, |_, _| echo).await;
        assert_eq!(status.call(), ("PATCH", STATUS_PATH));
        assert_eq!(status.body["status"]["lastDrains"]["forceClosed"], 1);
        let events = rest(&mut api).await;
        // BudgetApplied, ConfigApplied, and the drain and the pause each on
        // the route and on the Deployment.
        assert_eq!(events.len(), 6, "{events:?}");
        assert!(events.iter().all(|p| p.ends_with("/events")), "{events:?}");
    };
    let api: Api<GraceRoute> = Api::namespaced(ctx.client.clone(), "shop");
    scripted(script, update(&ctx, &api, &r, &seen, report))
        .await
        .expect("written");
    assert!(ctx.drains.take(&ObjectRef::from_obj(&r)).is_empty());
    // The status write's answer is remembered, so its watch event queues
    // nothing (controller::echoes).
    let mut written = r.metadata.clone();
    written.resource_version = Some("77".into());
    assert!(
        ctx.echoes
            .is_echo(crate::controller::echoes::Kind::GraceRoute, &written)
    );
}

#[tokio::test]
async fn a_failed_status_write_announces_nothing_and_keeps_the_drains_for_the_retry() {
    let (r, seen, report, ctx, mut api) = lossy_pass(ROUTE);
    let script = async move {
        let failure = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "conflict"});
        let status = answer_with(&mut api, 409, &failure).await;
        assert_eq!(status.call(), ("PATCH", STATUS_PATH));
        // No Event: the status does not hold what it would announce.
        no_more(&mut api).await;
    };
    let api: Api<GraceRoute> = Api::namespaced(ctx.client.clone(), "shop");
    let out = scripted(script, update(&ctx, &api, &r, &seen, report)).await;
    assert!(matches!(out, Err(Error::Write { .. })), "{out:?}");
    let kept = ctx.drains.take(&ObjectRef::from_obj(&r));
    assert_eq!(kept.len(), 1, "the drain waits for the retry");
    assert_eq!(ctx.drains.written(&ObjectRef::from_obj(&r)), None);
}
