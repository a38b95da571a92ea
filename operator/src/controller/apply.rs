//! Step 4, apply: the only step that writes objects other than the route's
//! status. Server-side apply as `kubegrace-operator`, forced: the ConfigMap
//! (checked to be ours in validate) and the rollout fields of an explicit
//! `rollout` block. Also the route's deletion: put back what it changed.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::dereference::{ReadWorkloads as _, Workloads, claim_targets};
use super::desired::Desired;
use crate::build;
use crate::crd::{GraceRoute, TargetKind};
use crate::{Error, FIELD_MANAGER, RESTORE_FIELD_MANAGER, Result};

/// Writes what [`super::desired::desired`] built.
pub async fn apply(client: &Client, ns: &str, desired: &Desired) -> Result<()> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let cm_name = desired.config_map.name_any();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(&cm_name, &pp, &Patch::Apply(&desired.config_map))
        .await
        .map_err(Error::kube(format!("applying ConfigMap {ns}/{cm_name}")))?;
    for r in &desired.rollout {
        let result = match r.kind {
            TargetKind::Deployment => Api::<Deployment>::namespaced(client.clone(), ns)
                .patch(&r.name, &pp, &Patch::Apply(&r.body))
                .await
                .map(drop),
            TargetKind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), ns)
                .patch(&r.name, &pp, &Patch::Apply(&r.body))
                .await
                .map(drop),
        };
        result.map_err(Error::kube(format!(
            "applying rollout fields to {}/{}",
            r.kind, r.name
        )))?;
    }
    Ok(())
}

/// Route deleted: put back what it changed on its targets (in one write per
/// target, so pods roll at most once), then let go of the fields.
pub async fn cleanup(route: &GraceRoute, ctx: &Context) -> Result<Action> {
    let client = &ctx.client;
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let workloads = Workloads::list(client, &ns).await?;
    let known = ctx.routes.state();
    let others: Vec<&GraceRoute> = known.iter().map(AsRef::as_ref).collect();
    let (held, _) = claim_targets(route, &workloads, &others);
    for (t, _) in held {
        // Only targets this route wrote to (an explicit rollout block, or a
        // pin from an earlier version): an overlapping, newer route never
        // wrote anything, and a route without rollout block wrote nothing.
        if t.recorded.is_none() && t.pinned_route() != Some(name.as_str()) {
            continue;
        }
        let empty = json!({
            "apiVersion": "apps/v1",
            "kind": t.kind.to_string(),
            "metadata": {"name": t.name},
        });
        let restore = build::restore_patch(t);
        let res = match t.kind {
            TargetKind::Deployment => {
                restore_one(
                    Api::<Deployment>::namespaced(client.clone(), &ns),
                    &t.name,
                    restore.as_ref(),
                    &empty,
                )
                .await
            }
            TargetKind::StatefulSet => {
                restore_one(
                    Api::<StatefulSet>::namespaced(client.clone(), &ns),
                    &t.name,
                    restore.as_ref(),
                    &empty,
                )
                .await
            }
        };
        match res {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(Error::kube(format!("restoring {}", t.id()))(e)),
        }
        super::publish(
            ctx,
            route,
            EventType::Normal,
            "Restored",
            "Cleanup",
            format!(
                "{} got its original rollout fields and grace period back",
                t.id()
            ),
        )
        .await;
    }
    Ok(Action::await_change())
}

/// Puts the originals back (merge patch, its own field manager), then
/// releases every field `kubegrace-operator` applied (an empty apply).
async fn restore_one<K>(
    api: Api<K>,
    name: &str,
    restore: Option<&serde_json::Value>,
    empty: &serde_json::Value,
) -> std::result::Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(p) = restore {
        let merge = PatchParams {
            field_manager: Some(RESTORE_FIELD_MANAGER.into()),
            ..Default::default()
        };
        api.patch(name, &merge, &Patch::Merge(p)).await?;
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(empty),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Request, Response};
    use kube::client::Body;

    use super::*;
    use crate::controller::fixtures::{DEPLOYMENT, ROUTE, observed, route};
    use crate::controller::{desired, validate};

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn desired_for(route_yaml: &str) -> Desired {
        let r = route(route_yaml);
        let seen = observed(&r, &[DEPLOYMENT], &[]);
        let valid = validate::check(&r, &seen).expect("valid");
        desired::desired(&r, &valid, &seen).expect("desired")
    }

    /// Answers the next request, which must be a forced server-side apply
    /// by `kubegrace-operator` on `path`, with `answer`; returns its body.
    async fn expect_apply(
        api: &mut Handle,
        path: &str,
        answer: serde_json::Value,
    ) -> serde_json::Value {
        let (req, send) = api.next_request().await.expect("a request");
        assert_eq!((req.method().as_str(), req.uri().path()), ("PATCH", path));
        let query = req.uri().query().unwrap_or_default().to_owned();
        assert!(
            query.contains("fieldManager=kubegrace-operator") && query.contains("force=true"),
            "{query}"
        );
        assert_eq!(
            req.headers().get("content-type").map(|v| v.as_bytes()),
            Some(&b"application/apply-patch+yaml"[..])
        );
        let body = req.into_body().collect_bytes().await.expect("body");
        send.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&answer).expect("json")))
                .expect("response"),
        );
        serde_json::from_slice(&body).expect("json body")
    }

    /// The API calls, scripted: a missing call or an extra one fails the
    /// test (the script and the apply each have one second).
    async fn run_script(
        d: Desired,
        script: impl std::future::Future<Output = ()> + Send + 'static,
        api_client: Client,
    ) {
        let server = tokio::spawn(script);
        tokio::time::timeout(Duration::from_secs(1), apply(&api_client, "shop", &d))
            .await
            .expect("no missing answer")
            .expect("apply succeeds");
        tokio::time::timeout(Duration::from_secs(1), server)
            .await
            .expect("script done")
            .expect("script passed");
    }

    #[tokio::test]
    async fn without_a_rollout_block_apply_writes_the_config_map_and_nothing_else() {
        let (svc, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let d = desired_for(ROUTE);
        let cm = serde_json::to_value(&d.config_map).expect("cm");
        run_script(
            d,
            async move {
                let sent = expect_apply(
                    &mut api,
                    "/api/v1/namespaces/shop/configmaps/kubegrace-web",
                    cm.clone(),
                )
                .await;
                assert_eq!(sent["data"], cm["data"]);
                // No further call: the Deployment is not touched.
                assert!(
                    tokio::time::timeout(Duration::from_millis(100), api.next_request())
                        .await
                        .is_err(),
                    "an unexpected API call"
                );
            },
            Client::new(svc, "shop"),
        )
        .await;
    }

    #[tokio::test]
    async fn an_explicit_rollout_block_is_applied_to_the_target_after_the_config_map() {
        let (svc, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let d = desired_for(&format!("{ROUTE}  rollout: {{minReadySeconds: 3}}\n"));
        let cm = serde_json::to_value(&d.config_map).expect("cm");
        let deployment: serde_json::Value = serde_norway::from_str(DEPLOYMENT).expect("deployment");
        run_script(
            d,
            async move {
                expect_apply(
                    &mut api,
                    "/api/v1/namespaces/shop/configmaps/kubegrace-web",
                    cm,
                )
                .await;
                let sent = expect_apply(
                    &mut api,
                    "/apis/apps/v1/namespaces/shop/deployments/web",
                    deployment,
                )
                .await;
                assert_eq!(sent["spec"]["minReadySeconds"], 3);
            },
            Client::new(svc, "shop"),
        )
        .await;
    }
}
