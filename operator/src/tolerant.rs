//! GraceRoutes read one object at a time, so one the operator cannot decode
//! affects that route alone.
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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::crd::GraceRoute;
use crate::{Error, Result};

/// Condition reason: the stored object does not decode.
pub const INVALID_OBJECT: &str = "InvalidObject";

/// Longest decode error kept: serde quotes the offending value, which a
/// client controls (a string field can hold a megabyte).
pub const MAX_ERROR_LEN: usize = 512;

/// The GraceRoute kind, for dynamic APIs, watches and object references.
pub fn api_resource() -> ApiResource {
    ApiResource::erase::<GraceRoute>(&())
}

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

/// A stored GraceRoute that does not decode, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    pub namespace: String,
    pub name: String,
    /// The serde error, with the path of the field (`spec.circuitBreaker.
    /// consecutiveFailures: invalid value: ...`), at most [`MAX_ERROR_LEN`].
    pub error: String,
}

impl Undecodable {
    /// The condition message: what is wrong and what to do.
    pub fn message(&self) -> String {
        format!(
            "the operator cannot read this GraceRoute: {}. It is not reconciled until that field is fixed \
             (kubectl edit graceroute {} -n {}); objects stored before a CRD upgrade can hold values the new schema refuses",
            self.error, self.name, self.namespace
        )
    }
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GraceRoute {}/{}: {}",
            self.namespace, self.name, self.error
        )
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn bounded(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// Decodes a dynamic object into `K`; the error names the field that
/// failed. Consumes the object, so no copy of its data is made.
pub fn into_typed<K: DeserializeOwned>(obj: DynamicObject) -> std::result::Result<K, String> {
    let DynamicObject {
        types,
        metadata,
        data,
    } = obj;
    let mut value = match data {
        Value::Object(map) => Value::Object(map),
        // A Kubernetes object is a JSON object; anything else has no fields
        // to read.
        _ => json!({}),
    };
    if let Some(t) = types {
        value["apiVersion"] = Value::String(t.api_version);
        value["kind"] = Value::String(t.kind);
    }
    value["metadata"] = serde_json::to_value(metadata).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| bounded(e.to_string(), MAX_ERROR_LEN))
}

/// Decodes one stored route.
pub fn decode(obj: &DynamicObject) -> std::result::Result<GraceRoute, Undecodable> {
    into_typed(obj.clone()).map_err(|error| Undecodable {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        error,
    })
}

/// The routes of a namespace: those that decode, and those that do not.
#[derive(Debug, Default)]
pub struct Listed {
    pub routes: Vec<GraceRoute>,
    pub undecodable: Vec<Undecodable>,
}

/// Splits dynamic objects into decoded routes and undecodable ones.
pub fn split(objects: impl IntoIterator<Item = DynamicObject>) -> Listed {
    let mut out = Listed::default();
    for obj in objects {
        match decode(&obj) {
            Ok(r) => out.routes.push(r),
            Err(u) => out.undecodable.push(u),
        }
    }
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

/// Decoded routes by uid, with the resourceVersion they were decoded at.
type Decoded = HashMap<String, (String, Arc<GraceRoute>)>;

/// The route controller's store, read as typed routes. Each object is
/// decoded once per resourceVersion (the mappers read every route on every
/// pod event); undecodable ones are left out: their own reconcile reports
/// them.
#[derive(Clone)]
pub struct Routes {
    store: Store<DynamicObject>,
    decoded: Arc<Mutex<Decoded>>,
}

impl Routes {
    pub fn new(store: Store<DynamicObject>) -> Self {
        Self {
            store,
            decoded: Arc::default(),
        }
    }

    /// Every stored route that decodes.
    pub fn state(&self) -> Vec<Arc<GraceRoute>> {
        let objects = self.store.state();
        let mut cache = self.decoded.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = HashSet::with_capacity(objects.len());
        let mut out = Vec::with_capacity(objects.len());
        for obj in objects {
            let key = obj.uid().unwrap_or_else(|| {
                format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
            });
            let version = obj.resource_version().unwrap_or_default();
            seen.insert(key.clone());
            if let Some((v, r)) = cache.get(&key)
                && *v == version
            {
                out.push(r.clone());
                continue;
            }
            cache.remove(&key);
            if let Ok(r) = decode(&obj) {
                let r = Arc::new(r);
                cache.insert(key, (version, r.clone()));
                out.push(r);
            }
        }
        cache.retain(|k, _| seen.contains(k));
        out
    }

    /// Whether `namespace/name` is stored (decodable or not).
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        let mut key = ObjectRef::new_with(name, api_resource());
        key.namespace = Some(namespace.to_string());
        self.store.get(&key).is_some()
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
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    use super::*;

    fn object(name: &str, spec: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}"),
                         "resourceVersion": "1", "generation": 2},
            "spec": spec,
            "status": status,
        }))
        .expect("dynamic object")
    }

    fn good(name: &str) -> DynamicObject {
        object(
            name,
            json!({"targetRef": {"kind": "Deployment", "name": name}, "ports": [{"name": "http"}]}),
            json!({}),
        )
    }

    fn bad(name: &str) -> DynamicObject {
        object(
            name,
            json!({"targetRef": {"kind": "Deployment", "name": name}, "ports": [{"name": "http"}],
                   "circuitBreaker": {"consecutiveFailures": 4_294_967_296_u64}}),
            json!({}),
        )
    }

    #[test]
    fn one_undecodable_route_is_left_out_by_name_and_the_others_decode() {
        let listed = split([good("a"), bad("b"), good("c")]);
        let names: Vec<String> = listed.routes.iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(listed.undecodable.len(), 1);
        let u = &listed.undecodable[0];
        assert_eq!((u.namespace.as_str(), u.name.as_str()), ("shop", "b"));
        assert!(
            u.error
                .starts_with("spec.circuitBreaker.consecutiveFailures: "),
            "{}",
            u.error
        );
    }

    /// The error quotes the value, which the client chose: it is bounded.
    #[test]
    fn the_error_is_bounded_at_the_limit() {
        let long = "é".repeat(MAX_ERROR_LEN);
        let obj = object("x", json!({"targetRef": long, "ports": []}), json!({}));
        let err = decode(&obj).expect_err("undecodable").error;
        assert!(err.len() <= MAX_ERROR_LEN + 3, "{}", err.len());
        assert!(err.ends_with("..."));
        let short = decode(&bad("b")).expect_err("undecodable").error;
        assert!(short.len() < MAX_ERROR_LEN && !short.ends_with("..."));
        assert_eq!(bounded("abc".into(), 3), "abc");
        assert_eq!(bounded("abcd".into(), 3), "abc...");
    }

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
    fn the_store_reads_the_routes_that_decode_and_knows_the_others() {
        let mut writer = Writer::<DynamicObject>::new(api_resource());
        for obj in [good("a"), bad("b")] {
            writer.apply_watcher_event(&Event::Apply(obj));
        }
        let routes = Routes::new(writer.as_reader());
        let names: Vec<String> = routes.state().iter().map(|r| r.name_any()).collect();
        assert_eq!(names, ["a"]);
        assert!(routes.contains("shop", "b") && !routes.contains("shop", "c"));
        // Fixed in a new version: read.
        let mut fixed = good("b");
        fixed.metadata.resource_version = Some("2".into());
        writer.apply_watcher_event(&Event::Apply(fixed));
        let mut names: Vec<String> = routes.state().iter().map(|r| r.name_any()).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }
}
