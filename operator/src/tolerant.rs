//! GraceRoutes read one object at a time, so one the operator cannot decode
//! affects that route alone. The decoding is the API crate's
//! ([`kubegrace_api::tolerant`]); here are the API calls, the controller's
//! store and the status written on an undecodable route.
//!
//! A typed LIST or watch of GraceRoutes fails as a whole on the first item
//! whose JSON does not fit the Rust type: a value the API server stored
//! under an older, looser schema (before a CRD upgrade added a bound), or a
//! field the API server does not check (`format: uint32`). Every reader of
//! GraceRoutes (the route controller, the workload controller, both
//! webhooks, the kubectl plugin) lists or watches them as [`DynamicObject`]s
//! with [`api_resource`] and decodes each with [`decode`]: the good ones go
//! on, an undecodable one is reported by name with the field that failed
//! ([`Undecodable`]); the route controller writes it into the route's
//! status ([`invalid_status`]) with a patch that needs no typed object.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use serde_json::{Value, json};

pub use kubegrace_api::tolerant::{
    Listed, MAX_ERROR_LEN, Undecodable, api_resource, bounded, decode, into_typed, split,
};

use crate::crd::GraceRoute;
use crate::webhook_cache::{Cache, RouteEntry, route_entry};
use crate::{Error, Result};

/// Condition reason: the stored object does not decode.
pub const INVALID_OBJECT: &str = "InvalidObject";

/// GraceRoutes as dynamic objects, in one namespace or all.
pub fn api(client: &Client, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = api_resource();
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// A route's reference in the dynamic controller's terms.
pub fn erase(r: &ObjectRef<GraceRoute>) -> ObjectRef<DynamicObject> {
    let mut out = ObjectRef::new_with(&r.name, api_resource());
    out.namespace.clone_from(&r.namespace);
    out
}

/// Lists the GraceRoutes of `ns`; one that does not decode is left out,
/// logged and returned in [`Listed::undecodable`], never an error.
pub async fn list(client: &Client, ns: &str) -> Result<Listed> {
    let objects = api(client, Some(ns))
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing GraceRoutes in {ns}")))?
        .items;
    let listed = split(objects);
    for u in &listed.undecodable {
        tracing::warn!(namespace = %u.namespace, route = %u.name, error = %u.error, "GraceRoute does not decode; left out");
    }
    Ok(listed)
}

/// The route controller's routes, decoded once per watch event and kept by
/// (namespace, name), so what a mapper or a reconcile asks of a namespace
/// costs the routes of that namespace, not the cluster's: the pod watch
/// asks on every event of every pod, and before this index each ask
/// decoded-or-looked-up every route of the cluster (2,000 routes times
/// some 100,000 pod events in a storm of 20,000 pods). Fed from the
/// controller's own watch events ([`Routes::apply`], see
/// [`crate::controller::run`]); an undecodable route is held as its
/// [`Undecodable`] (its own reconcile reports it) and left out of what
/// readers get. During a re-list the last complete list stays readable,
/// as in kube-rs's reflector store.
#[derive(Clone, Default)]
pub struct Routes {
    index: Arc<Cache<RouteEntry>>,
}

impl Routes {
    /// One watch event of the route controller's watch.
    pub fn apply(&self, event: &Event<DynamicObject>) {
        self.index.apply(event.clone(), route_entry);
    }

    /// The routes of `namespace` that decode.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<GraceRoute>> {
        self.index
            .held_in_namespace(namespace)
            .into_iter()
            .filter_map(std::result::Result::ok)
            .collect()
    }

    /// Whether `namespace/name` is stored (decodable or not).
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.index.holds(namespace, name)
    }
}

/// The `status` merge patch that reports `why` on `obj` (pure): `Accepted`
/// and `Ready` False with reason [`INVALID_OBJECT`], observedGeneration the
/// object's generation, the other conditions kept. `None` when the status
/// already says exactly that (no write, no watch event, no loop).
pub fn invalid_status(obj: &DynamicObject, why: &Undecodable, now: &Time) -> Option<Value> {
    let generation = obj.metadata.generation;
    let ready = format!(
        "not reconciled: {}",
        bounded(why.error.clone(), MAX_ERROR_LEN)
    );
    let wanted = [
        (crate::controller::ACCEPTED, "False", why.message()),
        (crate::controller::READY, "False", ready),
    ];
    let conditions = conditions_patch(obj, INVALID_OBJECT, &wanted, now);
    let old_generation = obj
        .data
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if conditions.is_none() && old_generation == generation {
        return None;
    }
    let conditions = conditions.or_else(|| obj.data.pointer("/status/conditions").cloned());
    Some(json!({"status": {"observedGeneration": generation, "conditions": conditions}}))
}

/// The stored conditions with each of `wanted` (type, status, message) set
/// under `reason`, the others kept (pure); `None` when they already say
/// that. lastTransitionTime moves only when a condition's status does.
pub fn conditions_patch(
    obj: &DynamicObject,
    reason: &str,
    wanted: &[(&str, &str, String)],
    now: &Time,
) -> Option<Value> {
    let old: Vec<Value> = obj
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let generation = obj.metadata.generation;
    let mut changed = false;
    let mut list: Vec<Value> = old
        .iter()
        .filter(|c| !wanted.iter().any(|(t, ..)| c["type"] == *t))
        .cloned()
        .collect();
    for (type_, status, message) in wanted {
        let prev = old.iter().find(|c| c["type"] == *type_);
        let same = prev.is_some_and(|p| {
            p["status"] == *status
                && p["reason"] == reason
                && p["message"] == message.as_str()
                && p.get("observedGeneration").and_then(Value::as_i64) == generation
        });
        changed |= !same;
        let since = prev
            .filter(|p| p["status"] == *status)
            .and_then(|p| p.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        list.push(json!({
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }));
    }
    changed.then_some(Value::Array(list))
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use kubegrace_api::fixtures::{decodable_route as good, undecodable_route as bad};

    use super::*;

    #[test]
    fn the_invalid_status_keeps_other_conditions_and_is_written_once() {
        let degraded = json!({"type": "Degraded", "status": "True", "reason": "PodsNotInjected",
                              "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let accepted = json!({"type": "Accepted", "status": "True", "reason": "Valid",
                              "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let mut obj = bad("b");
        obj.data["status"] =
            json!({"observedGeneration": 1, "conditions": [accepted, degraded.clone()]});
        let why = decode(&obj).expect_err("undecodable");
        let now = Time(jiff::Timestamp::now());
        let patch = invalid_status(&obj, &why, &now).expect("a write");
        assert_eq!(patch["status"]["observedGeneration"], 2);
        let list = patch["status"]["conditions"].as_array().expect("list");
        assert_eq!(list[0], degraded);
        assert_eq!(list[1]["type"], "Accepted");
        assert_eq!(list[1]["reason"], INVALID_OBJECT);
        assert_eq!(list[1]["status"], "False");
        assert_eq!(list[2]["type"], "Ready");
        // Written: the next pass writes nothing.
        obj.data["status"] = patch["status"].clone();
        assert_eq!(invalid_status(&obj, &why, &now), None);
        // A new generation (still undecodable): written again.
        obj.metadata.generation = Some(3);
        assert!(invalid_status(&obj, &why, &now).is_some());
    }

    #[test]
    fn the_index_reads_the_routes_that_decode_and_knows_the_others() {
        let routes = Routes::default();
        let other_ns = |mut r: DynamicObject| {
            r.metadata.namespace = Some("elsewhere".into());
            r
        };
        routes.apply(&Event::Init);
        for obj in [good("a"), bad("b"), other_ns(good("c"))] {
            routes.apply(&Event::InitApply(obj));
        }
        routes.apply(&Event::InitDone);
        let names = |ns: &str| -> Vec<String> {
            routes
                .in_namespace(ns)
                .iter()
                .map(|r| r.name_any())
                .collect()
        };
        assert_eq!(names("shop"), ["a"]);
        assert_eq!(names("elsewhere"), ["c"]);
        assert!(routes.contains("shop", "b") && !routes.contains("shop", "c"));
        // Fixed in a new version: read.
        let mut fixed = good("b");
        fixed.metadata.resource_version = Some("2".into());
        routes.apply(&Event::Apply(fixed));
        assert_eq!(names("shop"), ["a", "b"]);
        // A re-list in progress: the last complete list stays readable.
        routes.apply(&Event::Init);
        routes.apply(&Event::InitApply(good("a")));
        assert_eq!(names("shop"), ["a", "b"]);
        routes.apply(&Event::InitDone);
        assert_eq!(names("shop"), ["a"]);
        routes.apply(&Event::Delete(good("a")));
        assert!(names("shop").is_empty() && !routes.contains("shop", "a"));
    }
}
