//! What the controllers' stores keep of the objects they watch: what the
//! controllers read, nothing else.
//!
//! A kube-rs reflector keeps every object as the watch delivers it. For a
//! GraceRoute that is some 16 KiB of managedFields (and, after
//! `kubectl apply`, a second copy of the spec in an annotation) around a
//! spec of a few hundred bytes; for a Deployment it is the whole pod
//! template, the status and every manager's managedFields, where the
//! inject controller ([`crate::workload`]) reads the workload's inject
//! annotation, its template's labels and annotations, and its own
//! manager's managedFields entry. At 2,000 routes and Deployments the
//! difference is tens of MiB (`make bench-scale`).
//!
//! Each function here runs on every watch event before the reflector
//! stores the object (`watcher(..).modify(..)`), so what a reconcile reads
//! from the store is the slim object; the API writes are patches naming
//! their own fields, never the stored object sent back.

use futures_util::{Stream, TryStreamExt};
use kube::core::DynamicObject;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};

use crate::workload::Workload;
use crate::{INJECT_FIELD_MANAGER, keys};

/// `kubectl apply`'s copy of the whole object.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A route as the route controller keeps it: without managedFields and
/// `kubectl apply`'s copy (nothing in the operator reads either; its other
/// annotations stay).
pub fn route(obj: &mut DynamicObject) {
    cached(obj);
}

/// An object the route controller's cache keeps for its reconciles
/// ([`crate::controller::cache`]): whole, but for the managedFields and
/// `kubectl apply`'s copy, which no reconcile reads.
pub fn cached<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// A workload as the inject controller keeps it: its inject annotation,
/// labels, its pod template's metadata, and our inject manager's
/// managedFields entry ([`crate::workload::desired`] reads which fields it
/// owns there); no pod spec, no status, no other managers.
pub fn workload<K: Workload>(w: &mut K) {
    w.slim_template();
    let meta = w.meta_mut();
    if let Some(fields) = meta.managed_fields.as_mut() {
        fields.retain(|m| m.manager.as_deref() == Some(INJECT_FIELD_MANAGER));
    }
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| k == keys::INJECT);
    }
}

/// The controller's trigger stream and the store it reads, with each
/// object slimmed by `slim` before it is stored, and `each` shown every
/// event first (the route controller indexes its routes there).
pub fn reflect<K, F, E>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    slim: F,
    mut each: E,
) -> (
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    reflector::Store<K>,
)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
    F: FnMut(&mut K) + Send + 'static,
    E: FnMut(&watcher::Event<K>) + Send + 'static,
{
    let writer = Writer::<K>::new(dyntype);
    let reader = writer.as_reader();
    let events = watcher(api, config)
        .modify(slim)
        .inspect_ok(move |e| each(e));
    let trigger = reflector::reflector(writer, events).applied_objects();
    (trigger, reader)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_workload_keeps_what_the_inject_controller_reads() {
        let mut d: Deployment = serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u1",
                "annotations": {keys::INJECT: "enabled", LAST_APPLIED: "{...}", "deployment.kubernetes.io/revision": "3"},
                "managedFields": [
                    {"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
                    {"manager": INJECT_FIELD_MANAGER, "operation": "Apply", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:template": {"f:metadata": {"f:labels": {format!("f:{}", keys::INJECT): {}}}}}}}
                ]
            },
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web", keys::INJECT: "enabled"}},
                    "spec": {"containers": [{"name": "app", "image": "app"}]}
                }
            },
            "status": {"replicas": 3}
        }))
        .expect("deployment");
        let before = crate::workload::desired(&d);
        workload(&mut d);
        // What the controller decides is the same from the slim object.
        assert_eq!(crate::workload::desired(&d), before);
        assert!(d.status.is_none());
        let spec = d.spec.as_ref().expect("spec");
        assert!(spec.template.spec.is_none());
        assert_eq!(
            d.template_labels().get(keys::INJECT).map(String::as_str),
            Some("enabled")
        );
        let annotations = d.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.keys().collect::<Vec<_>>(), [keys::INJECT]);
        let managers: Vec<_> = d
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.as_deref())
            .collect();
        assert_eq!(managers, [INJECT_FIELD_MANAGER]);
    }

    #[test]
    fn a_route_loses_its_managed_fields_and_the_applied_copy_only() {
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {
                "name": "web", "namespace": "shop",
                "annotations": {LAST_APPLIED: "{...}", "team": "shop"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            },
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}]}
        }))
        .expect("route");
        route(&mut obj);
        assert!(obj.metadata.managed_fields.is_none());
        let annotations = obj.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["team"]);
        assert_eq!(obj.data["spec"]["targetRef"]["name"], "web");
    }
}
