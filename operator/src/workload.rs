//! `kubectl annotate deployment web kubegrace.io/inject=enabled`: copies a
//! workload's inject annotation into its pod template (label, which the
//! webhook's objectSelector sees, and annotation). Changing the template
//! rolls the pods, so they come back with the sidecar; removing the
//! annotation removes what we copied and rolls them back out.
//!
//! Applied with its own field manager ([`crate::INJECT_FIELD_MANAGER`]):
//! an apply that no longer sends a field removes it only if we own it, so a
//! label the user put on the template themselves is never touched.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::admin::Metrics;
use crate::{Error, INJECT_FIELD_MANAGER, Result, keys};

/// A workload with a pod template.
pub trait Workload:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    fn template_meta(&self) -> Option<&ObjectMeta>;
}

impl Workload for Deployment {
    const KIND: &'static str = "Deployment";
    fn template_meta(&self) -> Option<&ObjectMeta> {
        self.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
    }
}

impl Workload for StatefulSet {
    const KIND: &'static str = "StatefulSet";
    fn template_meta(&self) -> Option<&ObjectMeta> {
        self.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
    }
}

/// Whether our manager owns the template's inject label (from managedFields).
fn we_own_template_inject<K: Workload>(w: &K) -> bool {
    w.meta().managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(INJECT_FIELD_MANAGER)
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.to_string().contains(&format!("f:{}", keys::INJECT)))
    })
}

/// The apply body we want, or None if nothing needs writing (pure).
pub fn desired<K: Workload>(w: &K) -> Option<Value> {
    let want = w.annotations().get(keys::INJECT).cloned();
    let meta = w.template_meta();
    let label = meta
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(keys::INJECT));
    let ann = meta
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(keys::INJECT));
    let mut body = json!({
        "apiVersion": "apps/v1",
        "kind": K::KIND,
        "metadata": {"name": w.name_any()},
    });
    match want {
        Some(v) if label == Some(&v) && ann == Some(&v) && we_own_template_inject(w) => None,
        Some(v) => {
            body["spec"] = json!({"template": {"metadata": {
                "labels": {keys::INJECT: v},
                "annotations": {keys::INJECT: v},
            }}});
            Some(body)
        }
        // Gone from the workload: drop what we copied (and only that).
        None if we_own_template_inject(w) => Some(body),
        None => None,
    }
}

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
}

async fn reconcile<K: Workload>(w: Arc<K>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    let result = async {
        let Some(body) = desired(w.as_ref()) else {
            return Ok(Action::await_change());
        };
        let ns = w.namespace().unwrap_or_default();
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
        api.patch(
            &w.name_any(),
            &PatchParams::apply(INJECT_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(Error::kube(format!(
            "copying {} into the pod template of {}/{}",
            keys::INJECT,
            K::KIND,
            w.name_any()
        )))?;
        tracing::info!(
            kind = K::KIND,
            namespace = %ns,
            name = %w.name_any(),
            inject = ?w.annotations().get(keys::INJECT),
            "pod template inject setting changed; pods roll"
        );
        Ok(Action::await_change())
    }
    .await;
    ctx.metrics
        .reconciled(start.elapsed(), result.as_ref().err().map(Error::kind));
    result
}

fn error_policy<K: Workload>(_w: Arc<K>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "inject propagation failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the propagation for one workload kind until `shutdown` resolves.
pub async fn run<K: Workload>(
    client: Client,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics,
    });
    Controller::new(Api::<K>::all(client), watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(yaml: &str) -> Deployment {
        serde_yaml::from_str(yaml).expect("deployment")
    }

    #[test]
    fn the_annotation_is_copied_into_label_and_annotation() {
        let d = deploy(
            "metadata: {name: web, annotations: {kubegrace.io/inject: enabled}}\nspec: {selector: {}, template: {}}",
        );
        let body = desired(&d).expect("needs a write");
        assert_eq!(
            body["spec"]["template"]["metadata"]["labels"][keys::INJECT],
            "enabled"
        );
        assert_eq!(
            body["spec"]["template"]["metadata"]["annotations"][keys::INJECT],
            "enabled"
        );
    }

    #[test]
    fn nothing_to_do_without_annotation_or_ownership() {
        let d = deploy(
            "metadata: {name: web}\nspec: {selector: {}, template: {metadata: {labels: {kubegrace.io/inject: enabled}}}}",
        );
        // The user labelled the template themselves: not ours to remove.
        assert!(desired(&d).is_none());
    }

    #[test]
    fn removal_sends_an_empty_apply_when_we_own_the_copy() {
        let d = deploy(
            r#"
metadata:
  name: web
  managedFields:
  - manager: kubegrace-operator-inject
    operation: Apply
    fieldsType: FieldsV1
    fieldsV1: {"f:spec": {"f:template": {"f:metadata": {"f:labels": {"f:kubegrace.io/inject": {}}}}}}
spec: {selector: {}, template: {metadata: {labels: {kubegrace.io/inject: enabled}}}}
"#,
        );
        let body = desired(&d).expect("release");
        assert!(body.get("spec").is_none());
    }
}
