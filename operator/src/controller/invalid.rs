//! What the route controller does when a route cannot be reconciled the
//! normal way: the stored object does not decode ([`report_undecodable`]),
//! or the pass panicked ([`guarded`]). Either affects that route alone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::Context;
use crate::reasons::{DEGRADED, FINALIZER_RELEASED, RECONCILE_PANICKED};
use crate::tolerant::{self, Undecodable};
use crate::{Error, FINALIZER, Result};

/// Runs one reconcile of `obj`; a panic in it is counted, logged with the
/// route's name and written as its `Degraded` condition, and becomes an
/// error the error policy retries.
pub(crate) async fn guarded(
    ctx: &Context,
    obj: &DynamicObject,
    pass: impl std::future::Future<Output = Result<Action>>,
) -> Result<Action> {
    let msg = match crate::panics::catch(pass).await {
        Ok(result) => return result,
        Err(msg) => msg,
    };
    ctx.metrics.panicked("reconcile");
    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    tracing::error!(namespace = %ns, route = %name, panic = %msg, "reconcile panicked; the route is retried");
    let wanted = [(
        DEGRADED,
        "True",
        format!(
            "the operator hit a bug reconciling this route and retries it (please report it): {msg}"
        ),
    )];
    let now = Time(jiff::Timestamp::now());
    if let Some(list) = tolerant::conditions_patch(obj, RECONCILE_PANICKED, &wanted, &now) {
        let patch = serde_json::json!({"status": {"conditions": list}});
        let api = tolerant::api(&ctx.client, Some(&ns));
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(namespace = %ns, route = %name, error = %e, "writing the panic condition");
        }
    }
    Err(Error::Panic(msg))
}

/// A stored route that does not decode: `Accepted=False` with the field
/// and the fix (written only when the status does not say so yet), an
/// Event, the metric; waits for the route to change. Deleted, it lets go of
/// its finalizer (nothing can be restored from a spec that cannot be read)
/// and says so.
pub(crate) async fn report_undecodable(
    ctx: &Context,
    obj: &DynamicObject,
    why: &Undecodable,
) -> Result<Action> {
    let api = tolerant::api(&ctx.client, Some(&why.namespace));
    let reference = obj.object_ref(&tolerant::api_resource());
    if obj.metadata.deletion_timestamp.is_some() {
        ctx.metrics.route_decodes(&why.namespace, &why.name, true);
        let Some(i) = obj.finalizers().iter().position(|f| f == FINALIZER) else {
            return Ok(Action::await_change());
        };
        let path = format!("/metadata/finalizers/{i}");
        // `test` first: the list may have changed since the cache saw it.
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": path, "value": FINALIZER},
            {"op": "remove", "path": path},
        ]))
        .map_err(Error::serde("finalizer patch"))?;
        api.patch::<()>(&why.name, &PatchParams::default(), &Patch::Json(patch))
            .await
            .map_err(Error::kube(format!("releasing the finalizer of {why}")))?;
        let note = format!(
            "deleted while it could not be read ({}): the rollout fields it set on its targets, if any, were not restored",
            why.error
        );
        ctx.publish(
            &reference,
            None,
            EventType::Warning,
            FINALIZER_RELEASED,
            "Cleanup",
            note,
        )
        .await;
        return Ok(Action::await_change());
    }
    ctx.metrics.route_decodes(&why.namespace, &why.name, false);
    tracing::warn!(namespace = %why.namespace, route = %why.name, error = %why.error, "GraceRoute does not decode; reported on its status");
    let now = Time(jiff::Timestamp::now());
    if let Some(patch) = tolerant::invalid_status(obj, why, &now) {
        api.patch_status(&why.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!("writing status of {why}")))?;
        ctx.publish(
            &reference,
            None,
            EventType::Warning,
            tolerant::INVALID_OBJECT,
            "Reconcile",
            why.message(),
        )
        .await;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::controller::fixtures::scripted_context;
    use crate::testing::{self, Handle, no_more, scripted};

    /// A route the Rust type refuses: the API server stored it (no
    /// `maximum` in the CRD), `u32` cannot hold it.
    pub(crate) fn undecodable(extra_meta: Value, status: Value) -> DynamicObject {
        let mut meta = json!({"name": "bad", "namespace": "shop", "uid": "u-bad", "generation": 3});
        if let (Some(m), Some(extra)) = (meta.as_object_mut(), extra_meta.as_object()) {
            m.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": meta,
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}],
                     "circuitBreaker": {"consecutiveFailures": 4_294_967_296_u64}},
            "status": status,
        }))
        .expect("dynamic object")
    }

    /// Answers the next request with `answer`; returns its method, path and body.
    async fn next(api: &mut Handle, answer: Value) -> (String, String, Value) {
        let seen = testing::answer(api, &answer).await;
        (seen.method, seen.path, seen.body)
    }

    const STATUS_PATH: &str = "/apis/kubegrace.io/v1alpha1/namespaces/shop/graceroutes/bad/status";

    #[tokio::test]
    async fn an_undecodable_route_is_reported_by_name_on_its_status_an_event_and_a_metric() {
        let (ctx, mut api) = scripted_context();
        let obj = undecodable(json!({}), json!({}));
        let why = tolerant::decode(&obj).expect_err("undecodable");
        let echo = serde_json::to_value(&obj).expect("json");
        let script = async move {
            let (method, path, body) = next(&mut api, echo.clone()).await;
            assert_eq!((method.as_str(), path.as_str()), ("PATCH", STATUS_PATH));
            assert_eq!(body["status"]["observedGeneration"], 3);
            let accepted = body["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Accepted"))
                .cloned()
                .expect("Accepted");
            assert_eq!(
                (accepted["status"].as_str(), accepted["reason"].as_str()),
                (Some("False"), Some("InvalidObject"))
            );
            let msg = accepted["message"].as_str().unwrap_or_default();
            assert!(
                msg.contains("spec.circuitBreaker.consecutiveFailures"),
                "{msg}"
            );
            assert!(msg.contains("kubectl edit graceroute bad -n shop"), "{msg}");
            let (method, path, body) = next(&mut api, json!({})).await;
            assert_eq!(method, "POST", "{path}");
            assert_eq!(body["reason"], "InvalidObject", "{body}");
            no_more(&mut api).await;
        };
        let action = scripted(script, report_undecodable(&ctx, &obj, &why))
            .await
            .expect("reported");
        assert_eq!(action, Action::await_change());
        assert!(
            ctx.metrics.render().contains(
                "kubegrace_operator_route_undecodable{namespace=\"shop\",name=\"bad\"} 1"
            )
        );
    }

    /// The status write makes a watch event: the next pass must not write
    /// (or announce) it again, or the route loops.
    #[tokio::test]
    async fn a_route_whose_status_already_says_so_is_not_written_again() {
        let (ctx, mut api) = scripted_context();
        let first = undecodable(json!({}), json!({}));
        let why = tolerant::decode(&first).expect_err("undecodable");
        let now = Time(jiff::Timestamp::now());
        let patch = tolerant::invalid_status(&first, &why, &now).expect("a first write");
        let written = undecodable(json!({}), patch["status"].clone());
        let script = async move { no_more(&mut api).await };
        scripted(script, report_undecodable(&ctx, &written, &why))
            .await
            .expect("reported");
    }

    #[tokio::test]
    async fn a_deleted_undecodable_route_lets_go_of_its_finalizer_and_says_so() {
        let (ctx, mut api) = scripted_context();
        let obj = undecodable(
            json!({"finalizers": ["other.io/x", FINALIZER], "deletionTimestamp": "2026-01-01T00:00:00Z"}),
            json!({}),
        );
        ctx.metrics.route_decodes("shop", "bad", false);
        let why = tolerant::decode(&obj).expect_err("undecodable");
        let script = async move {
            let (method, path, body) = next(&mut api, json!({})).await;
            assert_eq!(
                (method.as_str(), path.as_str()),
                (
                    "PATCH",
                    "/apis/kubegrace.io/v1alpha1/namespaces/shop/graceroutes/bad"
                )
            );
            assert_eq!(
                body,
                json!([{"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                       {"op": "remove", "path": "/metadata/finalizers/1"}])
            );
            let (_, _, event) = next(&mut api, json!({})).await;
            assert_eq!(event["reason"], FINALIZER_RELEASED);
            no_more(&mut api).await;
        };
        scripted(script, report_undecodable(&ctx, &obj, &why))
            .await
            .expect("released");
        assert!(!ctx.metrics.render().contains("route_undecodable{"));
    }

    #[tokio::test]
    async fn a_panicking_reconcile_is_counted_written_as_degraded_and_retried() {
        let (ctx, mut api) = scripted_context();
        let obj = undecodable(json!({}), json!({}));
        let script = async move {
            let (method, path, body) = next(&mut api, json!({})).await;
            assert_eq!((method.as_str(), path.as_str()), ("PATCH", STATUS_PATH));
            let c = &body["status"]["conditions"][0];
            assert_eq!(
                (c["type"].as_str(), c["reason"].as_str()),
                (Some(DEGRADED), Some(RECONCILE_PANICKED))
            );
            assert!(
                c["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("index out of bounds"),
                "{c}"
            );
            no_more(&mut api).await;
        };
        let pass = async {
            let v: Vec<u8> = Vec::new();
            let i = v.len() + 1;
            // A bug: indexing past the end.
            Ok::<_, Error>(Action::requeue(Duration::from_secs(u64::from(v[i]))))
        };
        let out = scripted(script, guarded(&ctx, &obj, pass)).await;
        assert!(
            matches!(out, Err(Error::Panic(ref m)) if m.contains("index out of bounds")),
            "{out:?}"
        );
        assert!(
            ctx.metrics
                .render()
                .contains("kubegrace_operator_panics_total{task=\"reconcile\"} 1")
        );
    }
}
